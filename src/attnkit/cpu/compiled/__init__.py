"""A translation model's decoding step compiled ahead of time, for CPU translation (``decode.steps``).

Why: one step of a search (``Seq2SeqDecoding.next_logits``) is about a hundred small PyTorch operations
between a few matrix products, each issued from Python. Traced once and compiled, the step becomes one
function of C++ loops around oneDNN's products, with the weights packed at compile time and the
residual sums, layer norms and attention scaling fused: beam 5 over Multi30k's test set takes less
time, with the same outputs (``bench/translate_speed.py --compile``; the figures are in
docs/benchmarks.md).

How, one module a step:

- ``trace.py``: ``torch.export`` traces the model's own :meth:`EncoderDecoder.decode` with a KV cache
  rebuilt from tensors, so there is no second copy of the decoder to keep in step with the first; the
  cached length, the rows and the source length are symbols, so one compiled step serves every batch.
  The self-attention's past keys and values come as buffers of one position per row and an index of
  which row's is where (``SlotHistory``; bf16 where the linear maps multiply in bf16): beam search
  moves the index, not the keys, and the step reads each key once, inside the attention.
- ``build.py``: AOTInductor compiles the trace (with frozen weights) into a shared library, once per
  model, beam width and kind of loops: about 20 s. The loops are serial where each search runs on one
  thread (``decode.streams``' default, a stream per thread) and OpenMP loops over the caller's threads
  for a single stream; the two give the same bits.
- ``cache.py``: the library is kept in ``$XDG_CACHE_HOME/attnkit/steps`` under a key of the weights,
  the model's settings, the loops, the torch version and the processor's instruction sets, so that
  later runs load it in a moment. The cache is bounded: steps unused for 30 days go, and beyond 2 GiB
  the least recently used; ``attnkit cache clear`` empties it.
- ``library.py``: the library is called through ``ctypes``, which lets go of Python's lock for the whole
  step; PyTorch's own loader keeps it, which would let only one of the decoding streams run at a time.
  Its container holds one copy of the step per stream.
- ``steps.py``: :func:`~attnkit.cpu.compiled.steps.compiled_step`, the step of a model, built or loaded
  once per process and weights; where compiling fails (no C++ compiler, say), it says so once and
  translation goes on without it. :func:`~attnkit.cpu.compiled.steps.all_built` says whether a model's
  steps are there to load (a stat of a file, once the key is known): ``decode.steps=auto`` takes them
  where they are, and builds them only where that pays (decode/starts.py, serve/building.py).

The search takes the steps through ``attnkit.decode.compiled``, the model's own decoding with its
``next_logits`` swapped: the model knows nothing of it. Two steps are compiled: the first (``FirstStep``:
the encoder, the start token's decoding and the cross-attention's keys, one row per source; the same
for every beam width) and the next (``CachedStep``: one new token per row, one library per beam
width; for beam search ``RankedStep``, which ranks each source's continuations too and returns them in
place of the logits). Greedy search that checks drafts (``decode.speculative``) takes a third,
``CheckStep``: several new tokens per row, each position attended as the step of one token attends
it, so each gets that step's bits; a shallow draft decoder (models/draft.py) has a step and a check
step of its own, its weights and the model's it reads frozen into them. Models the trace cannot
express stay eager (the copy mechanism, another device or dtype:
:func:`~attnkit.cpu.compiled.build.compilable`).
"""
