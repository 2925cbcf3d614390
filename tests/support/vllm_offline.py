"""vLLM's own offline `LLM.generate` on a list of prompts: the reference that served outputs are compared with.

Run as `python -m tests.support.vllm_offline ENGINE_ARGS_JSON MAX_TOKENS` (the engine arguments a
model.json holds, with an absolute "model") and a JSON list of prompts on stdin; prints one line
`VLLM_OFFLINE {...}` mapping each prompt to its greedy text and token counts, and (for benchmarks)
the wall time of the generate call. A separate process because
vLLM starts its engine core with multiprocessing's spawn, which needs a guarded __main__.
"""

from __future__ import annotations

import json
import sys
import time

PREFIX = "VLLM_OFFLINE "


def generate(engine_args: dict, max_tokens: int, prompts: list[str]) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_args)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    results = {
        out.prompt: {"text": out.outputs[0].text, "prompt_tokens": len(out.prompt_token_ids),
                     "output_tokens": len(out.outputs[0].token_ids)}
        for out in outputs
    }
    return {"results": results, "seconds": seconds}


def main(argv: list[str]) -> None:
    engine_args, max_tokens = json.loads(argv[0]), int(argv[1])
    prompts = json.loads(sys.stdin.read())
    print(PREFIX + json.dumps(generate(engine_args, max_tokens, prompts)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
