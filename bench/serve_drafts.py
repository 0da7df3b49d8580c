"""A decoder or a translator served with drafts and without: one user's latency, the same answers.

``attnkit serve --ckpt RUN`` is started once plainly and then once for each ``--drafts`` (a value of
``decode.speculative``: ``source``, the default; ``shallow``; a draft checkpoint), one after the other,
with the same options: the running batch checks drafts (copied from a greedy request's prompt or
source, or guessed by a draft model) while the request is searched alone (decode/continuous.py). One
client posts greedy requests, each as soon as the last is answered, for ``--seconds``, after an untimed
pass over every input (which also gives the plain server's answers, against which the drafted
servers' are compared: ``differ`` is 0 where drafts are exact). A decoder (GPT): ``POST /generate``,
``temperature`` 0, ``--new-tokens`` tokens at most, its prompts as bench/speculative.py cuts them:
``--prompt-chars K`` cuts the file's last ``n·K`` characters into ``n`` prompts (tiny Shakespeare: the
end of ``input.txt``, the recipe's validation text), else each of its first ``n`` lines is one. A
translator: ``POST /translator/translate`` with ``beam_size`` 1, each of the file's first ``n`` lines a
sentence; its answers compared with their scores (a translation and its score, rounded to 1e-6).

Printed per server: latency p50 and p99, tokens/s (the checkpoint's tokenizer counts them), the
ratio of p50 to the plain server's, how many texts differ. Settings on both sides: greedy, the same
checkpoint, the server's own threads and workers (``--server-option`` passes more to both), the
same prompts in the same order, one request at a time.

Run: ``python bench/serve_drafts.py --ckpt runs/shakespeare --src data/tinyshakespeare/input.txt
--prompt-chars 64 --n 50 --drafts source --drafts shallow`` (``shallow``: after ``attnkit distill-draft
--ckpt runs/shakespeare``); a translator: ``python bench/serve_drafts.py --ckpt runs/de_en --src
test.de --n 100 --drafts shallow``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from functools import partial
from pathlib import Path

from keep_alive import KeepAlive
from serve_load import free_port, load, start

from attnkit.checkpoint.folder import read_run_config, resolve_checkpoint
from attnkit.data.readers import read_lines, read_text
from attnkit.data.tokenizer import Tokenizer
from attnkit.models import archs


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


async def answers(url: str, prompts: list[str], body, answer) -> dict[str, str]:
    """Each prompt's ``answer``, one request at a time (the untimed pass)."""
    connection, found = KeepAlive(url), {}
    for prompt in prompts:
        status, answered = await connection.post(body(prompt))
        if status != 200:
            raise SystemExit(f"the server answered {status}: {answered}")
        found[prompt] = answer(answered)
    await connection.close()
    return found


def scored(answered: list) -> str:
    """A translator's answer to one sentence: its translation and score (to 1e-6)."""
    best = answered[0][0]
    return f"{best['tgt']} ||| {best['pred_score']:.6f}"


def generation(prompt: str, new_tokens: int = 100) -> dict:
    """A greedy request to a decoder."""
    return {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens, "temperature": 0}}


def translation(sentence: str) -> list[dict]:
    """A greedy request to a translator (one sentence)."""
    return [{"src": sentence, "beam_size": 1}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True, help="a decoder (GPT) or translator checkpoint")
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
    checkpoint = resolve_checkpoint(args.ckpt)
    tokenizer = Tokenizer.load(checkpoint / "tokenizer.json")
    translator = read_run_config(checkpoint).model.arch in archs(using="translate")
    path, what = "/generate", "prompts"
    body, answer = partial(generation, new_tokens=args.new_tokens), lambda r: r["generated_text"]
    if translator:
        path, body, answer, what = "/translator/translate", translation, scored, "sentences"

    def count(text: str) -> int:  # (a translator's: its translation's tokens, not its score)
        text = text.split(" ||| ")[0]
        return len(tokenizer.encode(text)) if text else 0

    most = "" if translator else f", {args.new_tokens} new tokens at most"
    print(f"{len(prompts)} {what} from {args.src}; greedy{most}; one client, {args.seconds:g} s a server; "
          f"attnkit serve {' '.join(args.server_option)}")  # fmt: skip
    results, expected = {}, None
    for name, options in servers.items():
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "attnkit", "serve", "--ckpt", str(args.ckpt), "--port", str(port),
                   *options, *args.server_option]  # fmt: skip
        server = start(command, url)
        try:
            texts = asyncio.run(answers(f"{url}{path}", prompts, body, answer))
            expected = expected or texts
            results[name] = asyncio.run(load(
                f"{url}{path}", body, answer, 1, args.seconds, prompts, count, expected))  # fmt: skip
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
