"""A decoder served with drafts and without: one user's latency, the same texts.

``attnkit serve --ckpt GPT`` is started once plainly and then once for each ``--drafts`` (a value of
``decode.speculative``: ``source``, the default; ``shallow``; a draft checkpoint), one after the other,
with the same options: the running batch checks drafts (copied from a greedy prompt's context, or
guessed by a draft model) while the prompt is continued alone (decode/continuous.py). One client posts
greedy requests (``POST /generate``, ``temperature`` 0, ``--new-tokens`` tokens at most), each as soon
as the last is answered, for ``--seconds``, after an untimed pass over every prompt (which also gives
the plain server's texts, against which the drafted servers' are compared: ``differ`` is 0 where drafts
are exact). Prompts as bench/speculative.py cuts them: ``--prompt-chars K`` cuts the file's last ``n·K``
characters into ``n`` prompts (tiny Shakespeare: the end of ``input.txt``, the recipe's validation
text), else each of its first ``n`` lines is one.

Printed per server: latency p50 and p99, tokens/s (the checkpoint's tokenizer counts them), the
ratio of p50 to the plain server's, how many texts differ. Settings on both sides: greedy, the same
checkpoint, the server's own threads and workers (``--server-option`` passes more to both), the
same prompts in the same order, one request at a time.

Run: ``python bench/serve_drafts.py --ckpt runs/shakespeare --src data/tinyshakespeare/input.txt
--prompt-chars 64 --n 50 --drafts source --drafts shallow`` (``shallow``: after ``attnkit distill-draft
--ckpt runs/shakespeare``)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from keep_alive import KeepAlive
from serve_load import free_port, load, start

from attnkit.checkpoint.folder import resolve_checkpoint
from attnkit.data.readers import read_lines, read_text
from attnkit.data.tokenizer import Tokenizer


def prompts_of(src: str, n: int, prompt_chars: int | None) -> list[str]:
    """``n`` prompts: pieces of ``prompt_chars`` characters of the file's end, or its first lines."""
    if prompt_chars is None:
        return [line for line in read_lines(src) if line.strip()][:n]
    text = read_text(src)
    end = text[len(text) - n * prompt_chars :]
    return [end[i : i + prompt_chars] for i in range(0, len(end), prompt_chars)]


def named(drafts: str) -> str:
    """A server's name in the table: ``source drafts``, ``shallow drafts``, ``drafts of NAME``."""
    return f"{drafts} drafts" if drafts in ("source", "shallow") else f"drafts of {Path(drafts).name}"


async def answers(url: str, prompts: list[str], body) -> dict[str, str]:
    """Each prompt's text, one request at a time (the untimed pass)."""
    connection, found = KeepAlive(url), {}
    for prompt in prompts:
        status, answered = await connection.post(body(prompt))
        if status != 200:
            raise SystemExit(f"the server answered {status}: {answered}")
        found[prompt] = answered["generated_text"]
    await connection.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True, help="a decoder (GPT) checkpoint or run")
    parser.add_argument("--src", required=True, help="where the prompts come from")
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--prompt-chars", type=int, help="prompts: pieces of the file's end")
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--server-option", action="append", default=[], help="for every server")
    parser.add_argument("--drafts", action="append", help="decode.speculative of a server with drafts "
                        "(again for more): source (the default), shallow or a draft checkpoint")  # fmt: skip
    args = parser.parse_args()
    servers = {"plain": []} | {
        named(drafts): [f"decode.speculative={drafts}"] for drafts in args.drafts or ["source"]
    }
    prompts = prompts_of(args.src, args.n, args.prompt_chars)
    tokenizer = Tokenizer.load(resolve_checkpoint(args.ckpt) / "tokenizer.json")

    def body(prompt: str) -> dict:
        return {"inputs": prompt, "parameters": {"max_new_tokens": args.new_tokens, "temperature": 0}}

    def count(text: str) -> int:
        return len(tokenizer.encode(text)) if text else 0

    print(f"{len(prompts)} prompts from {args.src}; greedy, {args.new_tokens} new tokens at most; one "
          f"client, {args.seconds:g} s a server; attnkit serve {' '.join(args.server_option)}")  # fmt: skip
    results, expected = {}, None
    for name, options in servers.items():
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "attnkit", "serve", "--ckpt", str(args.ckpt), "--port", str(port),
                   *options, *args.server_option]  # fmt: skip
        server = start(command, url)
        try:
            texts = asyncio.run(answers(f"{url}/generate", prompts, body))
            expected = expected or texts
            results[name] = asyncio.run(load(
                f"{url}/generate", body, lambda r: r["generated_text"], 1, args.seconds, prompts, count,
                expected))  # fmt: skip
        finally:
            server.terminate()
            server.wait(timeout=60)
    plain = results["plain"]["p50"]
    print(f"{'server':20} {'p50 ms':>8} {'p99 ms':>8} {'tokens/s':>9} {'x plain p50':>12} {'differ':>7}")
    for name, r in results.items():
        print(f"{name:20} {r['p50']:8.1f} {r['p99']:8.1f} {r['tps']:9.1f} {r['p50'] / plain:12.2f} "
              f"{r['differ']:>7}")  # fmt: skip


if __name__ == "__main__":
    main()
