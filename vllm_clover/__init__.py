"""Clover speculative decoding for vLLM.

Importing this package is cheap: it pulls in neither vLLM nor torch. The vLLM plugin entry
point is `vllm_clover.plugin:register`; the command line is `vllm_clover.cli:main`.
"""

__version__ = "0.1.0"
