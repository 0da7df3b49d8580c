"""``attnkit export``: the paper's interleaved sinusoids are reordered into Marian's layout with the
model's function unchanged; HF transformers' MarianMTModel, loaded from the exported folder as it is,
translates exactly as attnkit does (greedy, the same token ids); and so does CTranslate2 from
``--to ctranslate2`` through ``attnkit translate --engine ctranslate2``."""

import pytest
import torch
from typer.testing import CliRunner

from attnkit.cli import app
from attnkit.config import load_run_config
from attnkit.convert.marian import with_concatenated_sinusoids
from attnkit.decode.translate import translate
from attnkit.loading import load_for_inference
from attnkit.models import TransformerConfig, build_model
from attnkit.train.loop import Trainer


@pytest.mark.parametrize(
    "fields",
    [{}, {"norm_first": True}, {"share_embeddings": False, "output_bias": True}],
    ids=["post-ln", "pre-ln", "separate-embeddings"],
)
def test_reordering_to_concatenated_sinusoids_keeps_the_models_function(fields):
    torch.manual_seed(0)
    config = TransformerConfig(
        encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, h=4, max_len=64, **fields
    )
    model = build_model(config, 40).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # LayerNorm's ones and zeros would hide a wrong order
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.2)
    converted = with_concatenated_sinusoids(model).double().eval()
    assert (
        model.config.sinusoid_layout == "interleaved" and converted.config.sinusoid_layout == "concatenated"
    )
    src, tgt = torch.randint(4, 40, (3, 9)), torch.randint(4, 40, (3, 7))
    expected = model(src, tgt)
    torch.testing.assert_close(converted(src, tgt), expected, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(build_model(converted.config, 40).double().eval()(src, tgt), expected)


@pytest.fixture(scope="module")
def trained(copy_data, tmp_path_factory):
    """A Transformer with the paper's interleaved sinusoids that has learned the copy task."""
    run = tmp_path_factory.mktemp("export") / "run"
    settings = ["model.preset=tiny", "data.train=[train.src, train.tgt]", "data.valid=[valid.src, valid.tgt]",
                f"data.dir={copy_data}", "data.tokenizer=word", "train.schedule=constant", "train.warmup=0",
                "train.lr=3e-3", "train.max_tokens=512", "train.max_steps=200",
                "train.eval_every=200"]  # fmt: skip
    Trainer(load_run_config(None, settings), run, echo=lambda m: None).fit()
    return run


def test_the_exported_folder_translates_in_hf_transformers_as_attnkit_does(trained, copy_data, tmp_path):
    transformers = pytest.importorskip("transformers", reason="HF transformers is the reference")
    run, out = trained, tmp_path / "hf"
    result = CliRunner().invoke(app, ["export", "--ckpt", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    files = [
        "config.json",
        "generation_config.json",
        "made_by.json",  # what made the folder, from which checkpoint (folders.py)
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sorted(p.name for p in out.iterdir()) == files

    ours, tokenizer, config = load_for_inference(run)
    sources = (copy_data / "valid.src").read_text(encoding="utf-8").splitlines()
    expected = translate(ours, tokenizer, sources, config.decode, beam_size=1)
    theirs = transformers.MarianMTModel.from_pretrained(out).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    eos = theirs.generation_config.eos_token_id
    outputs = []
    for text in sources:
        ids = hf_tokenizer(text)["input_ids"]
        assert ids == tokenizer.encode_batch([text])[0]  # the same tokenizer
        generated = theirs.generate(torch.tensor([[*ids, eos]]), do_sample=False, max_new_tokens=32)
        outputs.append(hf_tokenizer.decode(generated[0], skip_special_tokens=True))
    assert [o.split() for o in outputs] == [e.split() for e in expected]
    assert (
        sum(e == s for e, s in zip(expected, sources, strict=True)) >= 10
    )  # it learned something to compare


@pytest.mark.parametrize("alpha", [1.0, 0.0])
def test_beam_search_gives_hf_generates_beam_search_outputs(trained, copy_data, tmp_path, alpha):
    """HF's default beam search (keep the K best finished, scored log P / length^length_penalty; end when
    the best running beam, ended now, would not beat them) is attnkit's length penalty "length" with
    stop "no-better": the same outputs on the same weights."""
    transformers = pytest.importorskip("transformers", reason="HF transformers is the reference")
    out = tmp_path / "hf"
    assert CliRunner().invoke(app, ["export", "--ckpt", str(trained), "--out", str(out)]).exit_code == 0
    ours, tokenizer, config = load_for_inference(trained)
    config.decode.alpha, config.decode.length_penalty, config.decode.beam_stop = alpha, "length", "no-better"
    sources = (copy_data / "valid.src").read_text(encoding="utf-8").splitlines()
    expected = translate(ours, tokenizer, sources, config.decode, beam_size=3)
    theirs = transformers.MarianMTModel.from_pretrained(out).eval()
    outputs = []
    for ids in tokenizer.encode_batch(sources):
        bound = int(config.decode.max_len_a * (len(ids) + 1) + config.decode.max_len_b)
        source = torch.tensor([[*ids, tokenizer.specials.eos]])
        generated = theirs.generate(source, num_beams=3, do_sample=False, length_penalty=alpha,
                                    max_length=bound + 1)  # fmt: skip
        outputs.append(tokenizer.decode(generated[0].tolist()))
    assert outputs == expected


TIGHT = ["decode.max_len_a=0", "decode.max_len_b=3"]  # at most 2 tokens and </s>
ONLY_END = ["decode.max_len_a=0", "decode.max_len_b=1"]  # </s> alone: empty outputs


@pytest.mark.parametrize(("beam", "settings", "most_tokens"), [(1, [], None), (3, [], None), (1, TIGHT, 2),
                                                               (1, ONLY_END, 0)])  # fmt: skip
def test_the_ctranslate2_export_translates_as_attnkit_does(
    trained, copy_data, tmp_path, beam, settings, most_tokens
):
    """Greedy and beam search: the same outputs (both rank finished hypotheses by log P / length^α);
    greedy within a tight length bound too (attnkit's bound counts </s>, CTranslate2's does not)."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is the optional engine")
    out = tmp_path / "ct2"
    result = CliRunner().invoke(
        app, ["export", "--ckpt", str(trained), "--to", "ctranslate2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    source = tmp_path / "source.txt"
    source.write_text(
        (copy_data / "valid.src").read_text(encoding="utf-8") + "\n", encoding="utf-8"
    )  # and an empty line
    ours = CliRunner().invoke(
        app, ["translate", "--ckpt", str(trained), "--beam", str(beam), "-i", str(source), *settings]
    )
    ct2 = ["translate", "--engine", "ctranslate2", "--ckpt", str(out), "--beam", str(beam), "-i", str(source)]
    theirs = CliRunner().invoke(app, [*ct2, *settings])
    assert ours.exit_code == 0 and theirs.exit_code == 0, theirs.output
    assert theirs.stdout == ours.stdout and theirs.stdout.endswith("\n\n")
    if most_tokens is not None:
        assert max(len(line.split()) for line in ours.stdout.splitlines()) == most_tokens
    side_by_side = CliRunner().invoke(app, [*ct2, "--streams", "2", *settings])
    assert side_by_side.exit_code == 0 and side_by_side.stdout == ours.stdout, side_by_side.output


def test_the_ctranslate2_exports_n_best_from_the_command_line(trained, copy_data, tmp_path):
    """``translate --engine ctranslate2 --n-best``: attnkit's format, each line's best first and equal to
    the plain translation, none for an empty line; an output that a bound of one token leaves empty is
    scored log P(</s>), as attnkit scores it. (The scores themselves: tests/decode/test_translate.py.)"""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is the optional engine")
    runner, out = CliRunner(), tmp_path / "ct2"
    result = runner.invoke(app, ["export", "--ckpt", str(trained), "--to", "ctranslate2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    source = tmp_path / "source.txt"
    source.write_text(
        (copy_data / "valid.src").read_text(encoding="utf-8") + "\n", encoding="utf-8"
    )  # and an empty line: no hypotheses
    lines = len((copy_data / "valid.src").read_text(encoding="utf-8").splitlines())
    ct2 = ["translate", "--engine", "ctranslate2", "--ckpt", str(out), "--beam", "3", "-i", str(source)]
    plain = runner.invoke(app, ct2)
    result = runner.invoke(app, [*ct2, "--n-best", "3"])
    assert plain.exit_code == result.exit_code == 0, result.output
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert [int(row[0]) for row in rows] == sorted(int(row[0]) for row in rows)
    assert {int(row[0]) for row in rows} == set(range(lines))  # the empty last line has none
    firsts = [next(row[1] for row in rows if row[0] == str(i)) for i in range(lines)]
    assert firsts == plain.stdout.splitlines()[:lines]
    for i in range(lines):
        scores = [float(row[2]) for row in rows if row[0] == str(i)]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    ended = {}
    for engine, ckpt in (("attnkit", trained), ("ctranslate2", out)):
        precision = ["--precision", "fp32"] if engine == "attnkit" else []  # as CTranslate2's float32
        result = runner.invoke(app, ["translate", "--engine", engine, "--ckpt", str(ckpt), "--beam", "3",
                                     "--n-best", "1", "-i", str(source), *ONLY_END, *precision])  # fmt: skip
        assert result.exit_code == 0, result.output
        ended[engine] = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert len(ended["attnkit"]) == lines and all(row[1] == "" for row in ended["attnkit"])
    assert [(row[0], row[1]) for row in ended["ctranslate2"]] == [
        (row[0], row[1]) for row in ended["attnkit"]
    ]
    for ours, theirs in zip(ended["attnkit"], ended["ctranslate2"], strict=True):
        assert float(theirs[2]) == pytest.approx(float(ours[2]), abs=2e-4)


def test_evaluate_scores_the_ctranslate2_export_as_it_scores_the_checkpoint(trained, copy_data, tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is the optional engine")
    runner, out = CliRunner(), tmp_path / "ct2"
    assert (
        runner.invoke(
            app, ["export", "--ckpt", str(trained), "--to", "ctranslate2", "--out", str(out)]
        ).exit_code
        == 0
    )
    files = ["--src", str(copy_data / "valid.src"), "--ref", str(copy_data / "valid.tgt"), "--beam", "1"]
    ours = runner.invoke(app, ["evaluate", "--ckpt", str(trained), *files])
    theirs = runner.invoke(app, ["evaluate", "--engine", "ctranslate2", "--ckpt", str(out), *files])
    assert ours.exit_code == theirs.exit_code == 0, theirs.output
    assert ours.stdout.splitlines()[:2] == theirs.stdout.splitlines()[:2]  # BLEU and chrF, signatures too
    assert float(ours.stdout.split()[2]) > 0
    from attnkit.decode.ct2 import CTranslate2Translator

    done = []
    assert len(CTranslate2Translator(out).translate(["1 2", "", "3 4 5"], 1, done.append)) == 3
    assert sum(done) == 3  # the progress counts the empty line too
    gnmt = runner.invoke(app, ["translate", "--engine", "ctranslate2", "--ckpt", str(out), "--beam", "2",
                               "decode.length_penalty=gnmt"], input="1 2\n")  # fmt: skip
    assert gnmt.exit_code == 0 and "CTranslate2 ranks hypotheses by log P / length^α" in gnmt.stderr
    data = runner.invoke(app, ["evaluate", "--engine", "ctranslate2", "--ckpt", str(out), "--data", "x.txt"])
    assert (
        data.exit_code == 2
        and "a CTranslate2 translation model; use it with attnkit translate" in data.stderr
    )
    alone = runner.invoke(app, ["evaluate", "--engine", "ctranslate2", "--ckpt", str(out)])
    assert (
        alone.exit_code == 2 and "a translation model (--src FILE --ref FILE) or a decoder's" in alone.stderr
    )
    int8 = runner.invoke(app, ["evaluate", "--engine", "ctranslate2", "--ckpt", str(out), *files, "--int8"])
    assert int8.exit_code == 2 and "--quantization int8" in int8.stderr


def test_exporting_to_ctranslate2_leaves_the_model_untouched(trained, tmp_path):
    """CTranslate2 quantises its arrays in place; they must be copies, not views of the model's weights."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is the optional engine")
    from attnkit.convert.export import export_ctranslate2

    model, tokenizer, config = load_for_inference(trained)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    export_ctranslate2(model, tokenizer, vars(config.decode), tmp_path / "int8", quantization="int8")
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_an_exported_model_imported_back_translates_as_before(trained, copy_data, tmp_path):
    runner = CliRunner()
    assert (
        runner.invoke(app, ["export", "--ckpt", str(trained), "--out", str(tmp_path / "hf")]).exit_code == 0
    )
    result = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")])
    assert result.exit_code == 0, result.output
    source = copy_data / "valid.src"
    before = runner.invoke(app, ["translate", "--ckpt", str(trained), "--beam", "3", "-i", str(source)])
    after = runner.invoke(
        app, ["translate", "--ckpt", str(tmp_path / "back"), "--beam", "3", "-i", str(source)]
    )
    assert before.exit_code == after.exit_code == 0
    assert after.stdout == before.stdout and len(before.stdout.splitlines()) > 10
