"""Chat with a Clover-accelerated vLLM server through the `openai` client.

Start a server first (or run examples/serve_and_chat.sh, which does all of this):

    vllm-clover serve smollm2-135m-instruct --port 8000 --dtype float32 --enforce-eager \\
        --spec-method clover --spec-model checkpoints/smollm2-135m-instruct-clover --spec-tokens 4

then:

    python examples/openai_chat_client.py [--base-url http://127.0.0.1:8000]

It sends one chat request, streams a second one, and reads the server's Prometheus
`/metrics` for the speculative-decoding counters (drafts, accepted tokens, tau). Clover is
invisible to the client: requests and answers are plain OpenAI chat completions.
"""

import argparse
import re
import urllib.request

from openai import OpenAI

SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def spec_decode_counters(base_url: str) -> dict[str, float]:
    """The server's `vllm:spec_decode_*_total` counters (summed over label sets)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    counters = {}
    for name in SPEC_COUNTERS:
        values = re.findall(rf"^vllm:spec_decode_{name}_total(?:{{[^}}]*}})? (\S+)$", text, re.M)
        counters[name] = sum(map(float, values))
    return counters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    args = parser.parse_args()

    client = OpenAI(base_url=f"{args.base_url}/v1", api_key="unused")  # vLLM needs no key
    model = client.models.list().data[0].id
    print(f"model: {model}")

    question = "What is the capital of France?"
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], temperature=0, max_tokens=64
    )
    print(f"\n>>> {question}\n{reply.choices[0].message.content}")
    print(f"({reply.usage.completion_tokens} tokens)")

    question = "Write a short poem about speculative decoding."
    print(f"\n>>> {question} (streamed)")
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=96,
        stream=True,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()

    counters = spec_decode_counters(args.base_url)
    if not counters["num_drafts"]:
        print("\nno drafts on /metrics: is the server running with --speculative-config?")
        return
    tau = 1 + counters["num_accepted_tokens"] / counters["num_drafts"]
    print(
        f"\nserver /metrics: {counters['num_drafts']:.0f} drafts, "
        f"{counters['num_accepted_tokens']:.0f}/{counters['num_draft_tokens']:.0f} draft "
        f"tokens accepted, mean acceptance length tau = {tau:.2f}"
    )


if __name__ == "__main__":
    main()
