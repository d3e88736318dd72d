# The reference run (issue #61): the reference recipe from scratch, one schedule of 8 epochs
# over the bundled answers (the 200 held-out chat conversations left out) and the
# llamafactory answers, resumed across sessions.  usage: bash run.sh STEPS_THIS_SESSION
#
# Data, once:
#   python lf_prompts.py llamafactory-0.9.5.tar.gz lf-prompts.jsonl
#   vllm-clover generate-data --target smollm2-135m-instruct --data lf-prompts.jsonl \
#     --out lf-self.jsonl --max-turns 1 --max-new-tokens 192 --max-model-len 576 --temperature 0
#   xz -dc data/smollm2-135m-instruct-sharegpt-answers.jsonl.xz | head -n 11335 > train.jsonl
#   cat lf-self.jsonl >> train.jsonl      # 13,052 conversations
#   (lf-self.jsonl is also data/smollm2-135m-instruct-llamafactory-answers.jsonl.xz, decompressed)
#
# The teacher signal is cached once (20.4 GiB under cache/) and each step compiles the heads:
# where bf16 products have no AMX, streaming it made the teacher 73% of a 9-11 s step.
set -eu
res=""
[ -d ck/ref.train-state ] && res="--resume"
vllm-clover train --target smollm2-135m-instruct --out ck/ref --data train.jsonl \
  --max-seq-len 576 --eval-fraction 0 --num-heads 4 --clover2 --fuse-next-token \
  --head-projection linear --augmenting-gate --target-layers 2 15 27 \
  --draft-vocab-size 8192 --hidden-loss-weight 10 --head-weight-base 0.7 --lr 1e-3 --seed 0 \
  --label-top-k 1 --epochs 8 --batch-size 8 --dtype bfloat16 --cache-dir cache --no-progress \
  --teacher-signal cache --compile-heads --save-every 200 --stop-after "$1" $res
