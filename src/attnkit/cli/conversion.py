"""``attnkit import-hf`` and ``export``: models to and from HF transformers and CTranslate2."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnkit.cli.shared import Overwrite, app, one_line_errors
from attnkit.errors import AttnkitError
from attnkit.models import ARCHITECTURES, TransformerConfig, archs


@app.command("import-hf")
@one_line_errors
def import_hf(
    folder: Annotated[
        Path, typer.Argument(help="HF model folder: config.json, model.safetensors, tokenizer.json.")
    ],
    out: Annotated[Path, typer.Option(help="The run directory to write.")],
    overwrite: Overwrite = False,
) -> None:
    """Turn a local HF model folder (Marian translation, BERT-family or GPT-2; what save_pretrained
    writes) into an attnkit run directory that translate / predict / generate / evaluate use.

    Importing the same folder again replaces the earlier import; a run directory holding anything else
    (a trained run, another import) is refused unless --overwrite, which deletes its checkpoints first."""
    from attnkit.checkpoint.folder import CheckpointContents, list_checkpoints, save_checkpoint
    from attnkit.checkpoint.run_dir import clear_run, earlier_run
    from attnkit.config import RunConfig
    from attnkit.convert import from_hf
    from attnkit.convert.hf_folder import label_names
    from attnkit.folders import MadeBy, made_by
    from attnkit.loading import a_model, commands_for

    maker = MadeBy.of("attnkit import-hf", folder)
    earlier = earlier_run(out)
    again = (
        bool(earlier) and all(made_by(c) == maker for c in list_checkpoints(out)) and list_checkpoints(out)
    )
    if earlier and not (again or overwrite):
        raise AttnkitError(
            f"{out} already holds a run ({', '.join(p.name for p in earlier[:3])}), not an import of "
            f"{folder}; import into a new directory, or pass --overwrite to replace it"
        )
    model, tokenizer = from_hf(folder)
    run_config = RunConfig.for_model(model.config)
    if getattr(model.config, "classifies", False):
        run_config.data.labels = label_names(folder, model.config.num_labels)
    config = run_config.to_dict()
    if earlier and not again:  # --overwrite: the earlier run goes, as attnkit train --overwrite does
        clear_run(out)
    contents = CheckpointContents(
        model, config, tokenizer.to_str(), command=maker.command, source=maker.source
    )
    written = save_checkpoint(out, 0, contents, is_best=True)
    typer.echo(
        f"{written}: {a_model(model.config.arch)}; use it with {commands_for(model.config.arch)} --ckpt {out}"
    )


@app.command()
@one_line_errors
def export(
    ckpt: Annotated[Path, typer.Option(help="Checkpoint folder or run directory of a Transformer.")],
    out: Annotated[
        Path,
        typer.Option(help="The folder to write: a new or empty one, or this checkpoint's earlier export."),
    ],
    to: Annotated[
        str,
        typer.Option(
            help="hf: a folder HF transformers' from_pretrained loads (Marian, GPT-2 or BERT); "
            "ctranslate2: a CTranslate2 model (a translation model or a GPT-style decoder)."
        ),
    ] = "hf",
    quantization: Annotated[
        str | None, typer.Option(help="ctranslate2: int8, int8_float32, ... (default: float32 weights).")
    ] = None,
    overwrite: Overwrite = False,
) -> None:
    """Export a Transformer for another tool: --to hf writes a folder that HF transformers'
    from_pretrained loads (a translation model as MarianMTModel, a GPT-style decoder as GPT2LMHeadModel,
    a BERT-style encoder as the Bert class of its head); --to ctranslate2 a translation model or a
    GPT-style decoder for CTranslate2 (attnkit translate / generate --engine ctranslate2).

    Models with the paper's interleaved sinusoids are reordered exactly into Marian's layout. Exporting
    the same checkpoint again replaces the earlier export; any other folder is refused unless
    --overwrite, and the checkpoint exported is never replaced."""
    from attnkit.checkpoint.average import refuse_to_replace_a_source
    from attnkit.checkpoint.ctranslate2_folder import ctranslate2_command
    from attnkit.checkpoint.folder import resolve_checkpoint
    from attnkit.convert.export import export_ctranslate2, export_hf, hf_class_and_inputs
    from attnkit.folders import MadeBy
    from attnkit.loading import load_for_inference

    if to not in ("hf", "ctranslate2"):
        raise AttnkitError(f"--to {to!r}: attnkit exports to 'hf' (HF transformers) or 'ctranslate2'")
    if quantization is not None and to != "ctranslate2":
        raise AttnkitError("--quantization is for --to ctranslate2")
    exported = archs(exporting=to)
    model, tokenizer, config = load_for_inference(ckpt, "cpu", arch=exported, pack=False)
    checkpoint = resolve_checkpoint(ckpt)
    refuse_to_replace_a_source(out, [checkpoint])
    maker = MadeBy.of(f"attnkit export --to {to}", checkpoint)
    if to == "ctranslate2":
        written = export_ctranslate2(
            model, tokenizer, vars(config.decode), out, quantization, maker=maker, overwrite=overwrite
        )
        arch = config.model.arch
        typer.echo(f"{written}: {ARCHITECTURES[arch].commands[0]} with {ctranslate2_command(written, arch)}")
        if arch == TransformerConfig.ARCH and config.decode.length_penalty != "length":
            typer.echo(
                f"note: CTranslate2 ranks beams by log P / length^{config.decode.alpha}; this run's "
                f"decode.length_penalty={config.decode.length_penalty} has no CTranslate2 equivalent",
                err=True,
            )
        return
    written = export_hf(model, tokenizer, out, config.data.labels, maker=maker, overwrite=overwrite)
    kind, inputs = hf_class_and_inputs(model)
    typer.echo(f"{written}: load it with transformers.{kind}.from_pretrained({str(written)!r}); {inputs}")
