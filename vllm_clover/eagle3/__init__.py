"""EAGLE-3 drafters trained by vllm-clover, beside the Clover heads, on the same data and
teacher signal: ``config.py`` (the drafter's shape, the speculators config.json, the
`train-eagle3` flags), ``network.py`` (the drafter in pure PyTorch, as vLLM runs it, with the
training-time test unrolled), ``loss.py`` (loss and held-out figures), ``train.py`` (the
command), ``checkpoint.py`` (the speculators folder vLLM loads as ``"method": "eagle3"``).
Never imports vLLM."""
