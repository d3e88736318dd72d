# run in a folder holding prompts.jsonl and answers.jsonl (README.md)
set -x
vllm-clover train-eagle3 --target smollm2-135m-instruct --out d --data answers.jsonl --eval-fraction 0 --max-seq-len 2048 --draft-vocab-size 2048 --ttt-steps 4 --batch-size 4 --epochs 25 --lr 3e-3 --dtype bfloat16 --cache-dir cache --no-progress --overwrite
vllm-clover eval-heads --target smollm2-135m-instruct --heads d --data answers.jsonl --eval-fraction 0 --max-seq-len 2048 --dtype bfloat16 --cache-dir cache --no-progress
vllm-clover bench --methods vanilla eagle3 --eagle3-drafter d --prompts prompts.jsonl --batch-sizes 1 --temperatures 0 --max-tokens 64 --min-prompts 8 --repeats 1 --engines in-process --out bench --no-tie-check
