"""The most any exact prefix cache can reuse, per family and turn: the
conversation of ``bench/agent_families.py`` rendered by each zoo family's
own chat template, and for each turn the longest common prefix of its
prompt with what earlier turns left in the cache (their prompts and
replies, as the template renders a reply in the next turn).

A cached token is reusable without changing the output only when every
token before it is the same: past the first token that differs, each
layer's keys and values depend on it. So this share is the ceiling of
every technique that keeps greedy output equal to a cold prefill, and
``bench/agent_families.py``'s measured share can only reach it.
Checkpoints do not raise it: they choose where, before the divergence, an
untrimmable cache is kept.

    python bench/prefix_ceiling.py
    python bench/prefix_ceiling.py --families mistral3 qwen3 --turns 6

The answers are a fixed sentence (a random model's greedy text would give
the same divergence points). Tokenizers only: no model runs. Prints a
table and writes bench/results/prefix_ceiling.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench.agent_families import chat_tools, system_prompt  # noqa: E402
from bench.agent_turns import TOOL_RESULT, USER_TURNS  # noqa: E402
from bench.common import save, table  # noqa: E402

ANSWER = "I looked at the settings module; the timeout comes from the request field."


def common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def render(tokenizer: Any, messages: list[dict[str, Any]], generation: bool) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tools=chat_tools(), add_generation_prompt=generation))


def family_turns(name: str, turns: int) -> list[dict[str, Any]]:
    from mlx_lm.tokenizer_utils import load

    from mlxd.factory.zoo_build import build_family

    tokenizer = load(build_family(name))
    messages = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": USER_TURNS[0]}]
    rows: list[dict[str, Any]] = []
    # What earlier turns left in the cache: each prompt, and its reply after
    # it as the next turn renders the reply (a multi-entry cache keeps them all).
    left: list[list[int]] = []
    for turn in range(turns):
        prompt = render(tokenizer, messages, True)
        shared = max((common(c, prompt) for c in left), default=0)
        rows.append({"turn": turn + 1, "prompt_tokens": len(prompt), "ceiling": shared, "share": shared / len(prompt)})
        messages.append({"role": "assistant", "content": ANSWER})
        left += [prompt, render(tokenizer, messages, False)]
        nxt = TOOL_RESULT if turn % 2 == 0 else USER_TURNS[(turn // 2 + 1) % len(USER_TURNS)]
        messages.append({"role": "user", "content": nxt})
    return rows


def main() -> None:
    from mlxd.factory.zoo import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="*", default=[n for n, f in FAMILIES.items() if not f.vision])
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    results = {name: family_turns(name, args.turns) for name in args.families}
    rows = []
    for name, turns in results.items():
        later = [t["share"] for t in turns[1:]]
        rows.append([name, " ".join(f"{t['prompt_tokens']}/{t['ceiling']}" for t in turns),
                     f"{min(later):.3f}" if later else "-"])
    print(table(["family", "prompt/reusable tokens per turn", "min share, turns 2+"], rows))
    print(f"wrote {save('prefix_ceiling', 'families', results)}")


if __name__ == "__main__":
    main()
