"""Checkpoints: safetensors + JSON, written atomically, self-contained, resumable.

A run directory holds one folder per checkpoint, ``step-0000500/``, each with everything a later command
needs: ``config.json``, ``model.safetensors``, ``tokenizer.json`` (not for image models, which read
pixels), and for resuming ``trainer_state.safetensors`` (optimizer tensors, every process's RNG states)
+ ``trainer_state.json`` (step, epoch, position in the epoch, best score, scalar optimizer settings).
``last`` and ``best`` are small text files naming a checkpoint folder.

Why atomic: none of the usual tools (nanoGPT, JoeyNMT, HF) is, and a run killed while saving then
leaves a torn file that breaks resuming. Here a checkpoint folder is written whole or not at all
(folders.py, which also records in ``made_by.json`` what made it), and only then are the
``last``/``best`` pointers replaced (also by rename). A kill at any moment leaves a complete checkpoint
and pointers naming complete folders. Nothing is ever unpickled.

The format, one concern per module (loading a model to work with is ``attnkit.loading``, above):

- ``folder.py``: a checkpoint folder: write one, find one, read its config and weights;
- ``trainer_state.py``: what resuming needs besides the weights (optimizer, RNG states, the trainer's
  position), with ``optimizer.py``: the optimizer's state as named tensors;
- ``sharded.py``: the folder of an FSDP run, each process's shards of the model and the optimizer;
- ``run_dir.py``: one training process per run directory, and an earlier run found or cleared there;
- ``average.py``: the mean of several checkpoints' weights (the paper's §6.1);
- ``ctranslate2_folder.py``: the other model folder attnkit writes, a CTranslate2 export;
- ``draft_file.py``: a translation model's draft decoder, added to a complete checkpoint;
- ``files.py``: a checkpoint's JSON and safetensors files read with one-line errors.
"""
