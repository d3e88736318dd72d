"""The ledger's overrides, reliances and hooks: the vLLM internals the plugin's proposer,
draft model and tools call, read or wrap without replacing them (the ledger as a whole:
docs/design/engine-layer.md, "The patches ledger").
"""

from __future__ import annotations

from vllm_clover.patches.entry import (
    BASE,
    CPU_ATTN,
    EAGLE3,
    LAYERS,
    LLAMA,
    RUNNER,
    SCHEDULER,
    SPEC,
    Entry,
)

RELIANCES = (
    Entry(
        "clover_channel",
        "relies",
        "a Clover engine keeps its budget beside vLLM's Scheduler, its tree verifier beside "
        "the model runner and a tree step's layout beside the attention metadata: one "
        "dataclass each (patches/channel.py) under the attribute CHANNEL, which none of "
        "these vLLM classes defines; nothing else of the plugin's is set on them",
        "patches/channel.py",
        {
            f"{SCHEDULER}.__init__": "c02680245672",
            f"{RUNNER}.__init__": "f3466944c1e2",
            f"{CPU_ATTN}:CPUAttentionMetadata": "f342a75c3ef9",
        },
        attributes=("clover",),
    ),
    Entry(
        "eagle_block_drop",
        "relies",
        "the scheduler's KV-cache manager drops the last prefix-cache block a request hits "
        "when use_eagle_block_drop(); post_init sets disable_eagle_block_drop for every "
        "Clover engine: heads without the next-token fusion have draft KV that depends on the "
        "prefix only, heads with it drop the block themselves where needed (prefix_block_drop)",
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
        "core/proposer.py",
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
        "and reads the draft probabilities through take_last_draft_probs: (num_reqs, K, V) "
        "in the input batch's row order, of which the rejection sampler takes each "
        "request's first num_draft rows; the base's __init__ sets "
        "_enable_probabilistic_draft_probs from draft_sample_method and the rejection method; "
        "idle_step makes its empty drafts on the base's device",
        "core/proposer.py",
        {
            f"{BASE}.propose": "00017c139f27",
            f"{BASE}.take_last_draft_probs": "ee22f35a3ab6",
            f"{RUNNER}.propose_draft_token_ids": "a60269aca9de",
            f"{RUNNER}._get_spec_decode_draft_probs": "944db527e0dd",
        },
        attributes=(
            "num_speculative_tokens",
            "_last_draft_probs",
            "_enable_probabilistic_draft_probs",
            "device",
        ),
    ),
    Entry(
        "proposer_first_pass",
        "relies",
        "the Augmenting Block pass is the base propose()'s "
        "first draft pass, run with the base's own helpers; a next-token fusion "
        "(fuse_next_token) reads its input_ids, shifted one left with the sampled t0 at "
        "each request's last accepted token",
        "core/proposer.py",
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
        "hybrid_history",
        "relies",
        'with "lookup", each request\'s history is rebuilt in propose from the batch: the '
        "batch's rows are the proposer's (req_ids), token_ids_cpu[row, :p] holds its tokens "
        "before the step's span (p: the span's first position), num_tokens_no_spec[row] ends "
        "at p + 1 before vLLM's bookkeeping and at t0 after it (disable_padded_drafter_batch), "
        "num_prompt_tokens tells a prefill chunk with prompt still to come; a request's "
        "accepted drafts are its scheduled tokens up to token_indices_to_sample "
        "(prepare_inputs_padded) or the end of its query_start_loc_cpu span (prepare_inputs, "
        "rejected ones removed); spec_token_ids holds the drafts the step verified, "
        "req_prompt_embeds the prompt-embedding rows",
        "hybrid/drafter.py",
        {
            f"{BASE}.prepare_inputs_padded": "501b9a179802",
            f"{BASE}.prepare_inputs": "5149dfe0d6e1",
            "vllm.v1.worker.gpu_input_batch:InputBatch.add_request": "33b3f53b9b19",
            "vllm.v1.worker.gpu_input_batch:InputBatch.update_req_spec_token_ids": "44ebcd8666c2",
            f"{RUNNER}._bookkeeping_sync": "13c3e81003a7",
        },
        attributes=(
            "input_batch",
            "req_ids",
            "token_ids_cpu",
            "num_tokens_no_spec",
            "num_prompt_tokens",
            "spec_token_ids",
            "req_prompt_embeds",
            "query_start_loc_cpu",
        ),
    ),
    Entry(
        "proposer_attention",
        "override",
        "a drafter without attention layers (no Augmenting "
        "Block) fails the base's same-KV-group assertion",
        "core/proposer.py",
        {f"{BASE}.initialize_attn_backend": "3ab396fdfe7b"},
        attributes=("kv_cache_gid",),
    ),
    Entry(
        "proposer_cudagraph",
        "override",
        "the uncompiled draft model runs eagerly and unpadded",
        "core/proposer.py",
        {f"{BASE}.initialize_cudagraph_keys": "f35176814eb6"},
    ),
    Entry(
        "proposer_target_tables",
        "override",
        "the heads read the target's LM head and "
        "embedding instead of sharing them into an EAGLE model (under TP each rank attaches "
        "its shard), and refuse a target whose logits processor soft-caps or scales",
        "core/proposer.py",
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
        "core/model.py",
        {
            f"{LLAMA}:LlamaDecoderLayer.__init__": "2ea68a20c877",
            f"{LLAMA}:LlamaDecoderLayer.forward": "ab84e4013463",
            f"{LLAMA}:LlamaAttention.__init__": "5d21c8f75a4d",
            f"{LAYERS}.layernorm:RMSNorm": "aa290a8d5974",
            f"{LAYERS}.linear:QKVParallelLinear.weight_loader": "00825ed9842a",
            f"{LAYERS}.linear:MergedColumnParallelLinear.weight_loader": "ce9ec205b936",
            "vllm.model_executor.model_loader.weight_utils:default_weight_loader": "c9381bb21cf1",
        },
    ),
    Entry(
        "cpu_row_gemm",
        "relies",
        "on CPU drafting scores the draft rows, and runs the head network's linear layers, "
        "with vLLM's oneDNN GEMM, the kernel of its own Linear layers: create_onednn_mm "
        "packs the (K, N) float32 or bfloat16 weight view once (its CPUDNNLGEMMHandler "
        "frees the primitive when dropped), onednn_mm(handler, x, bias) returns x @ W + "
        "bias in x's dtype; the build has it where _supports_onednn is true",
        "cpu/gemm.py",
        {
            "vllm._custom_ops:create_onednn_mm": "a84bc6b8f2fa",
            "vllm._custom_ops:onednn_mm": "e7a98daed3c1",
            "vllm._custom_ops:CPUDNNLGEMMHandler": "b050a9e6bead",
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
    Entry(
        "eagle3_format",
        "relies",
        "train-eagle3 writes drafters that vLLM's own eagle3 method runs: config.json read by "
        "the speculators config update, weight names by Eagle3LlamaForCausalLM.load_weights "
        "(layers.0.*, fc, norm, lm_head, d2t as offsets, t2d skipped), and the drafter's step "
        "as its decoder layer and model compute it, which eagle3/network.py reproduces",
        "eagle3/checkpoint.py",
        {
            "vllm.transformers_utils.configs.speculators.algos:update_eagle3": "ced566519f0e",
            f"{EAGLE3}:Eagle3LlamaForCausalLM.load_weights": "58eb0277207b",
            f"{EAGLE3}:Eagle3LlamaForCausalLM.combine_hidden_states": "a5eedb3b0f5b",
            f"{EAGLE3}:Eagle3LlamaForCausalLM.compute_logits": "0af3f208eb38",
            f"{EAGLE3}:LlamaDecoderLayer.forward": "b5d842250169",
            f"{EAGLE3}:LlamaModel.forward": "504d2a14ea27",
            f"{EAGLE3}:LlamaModel.hf_to_vllm_mapper": "d97a2f30554d",
        },
    ),
)
