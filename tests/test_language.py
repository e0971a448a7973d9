"""language.py: GLUE reading and the tokenizer on a tiny TSV written here, pair encoding, model shapes and padding
masks, the hand-written LSTM against torch.nn.LSTM, the right-aligned sensitivity profile, a short end-to-end run."""

import json
import math
import os
import re
import shutil
import time
import urllib.error
import urllib.request
import zipfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import language
import report
import runs
from conftest import forward_sizes, loop_calls, optimizer_steps
from runs import seed_all, strict_json

PAIRS = [("The cat sat on the mat.", "A cat was sitting on a mat!", 1),
         ("Stocks fell 3% today.", "The weather was sunny, they said.", 0),
         ("He said: it works.", "It works, he said.", 1),
         ("Nothing here matches", "something else entirely", 0)]


def write_mrpc(folder, pairs, name):
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    lines += [f"{y}\t{i}\t{i + 1000}\t{a}\t{b}" for i, (a, b, y) in enumerate(pairs)]
    (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_tsv_reading_and_tokenizer_round_trip(tmp_path):
    write_mrpc(tmp_path / "MRPC", PAIRS, "train.tsv")
    pairs = language.read_tsv(str(tmp_path / "MRPC" / "train.tsv"), "mrpc")
    assert pairs == PAIRS
    tok = language.Tokenizer([t for a, b, _ in pairs for t in (a, b)], size=1000)
    assert tok.itos[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    for text in [s for a, b, _ in pairs for s in (a, b)]:
        assert tok.decode(tok.encode(text)) == language.words(text)  # every training word is in the vocabulary
    assert language.words("He said: it WORKS.") == ["he", "said", ":", "it", "works", "."]
    small = language.Tokenizer([t for a, b, _ in pairs for t in (a, b)], size=3)
    assert small.decode(small.encode("zebra the")) == ["<unk>", "the"]  # "the" is among the 3 most frequent


def test_pair_encoding_is_roberta_style_and_truncates():
    tok = language.Tokenizer(["a b c d e f g h"], size=100)
    seq = tok.encode_pair("a b c", "d e", max_len=20)
    assert tok.decode(seq) == ["<s>", "a", "b", "c", "</s>", "</s>", "d", "e", "</s>"]
    seq = tok.encode_pair("a b c d e f g", "h", max_len=8)
    assert len(seq) == 8 and tok.decode(seq) == ["<s>", "a", "b", "c", "</s>", "</s>", "h", "</s>"]
    seq = tok.encode_pair("h", "a b c d e f g", max_len=8)  # the second sentence is the longer one: it is cut
    assert tok.decode(seq) == ["<s>", "h", "</s>", "</s>", "a", "b", "c", "</s>"]
    ids, y = language.encode([("a b", "c", 1), ("d", "e f g", 0)], tok, 12)
    assert ids.shape == (2, 12) and (ids[:, -1] == language.PAD).all() and y.tolist() == [1, 0]
    assert tok.decode(ids[1, :8].tolist()) == ["<s>", "d", "</s>", "</s>", "e", "f", "g", "</s>"]  # each in its place


def test_trimming_padding_changes_nothing():
    args = language.parse_args(["--dim", "32", "--heads", "4", "--depth", "2", "--max-len", "16"])
    tokens = torch.randint(4, 50, (3, 16))
    tokens[:, 9:] = language.PAD
    tokens[0, 7:] = language.PAD
    assert language.trim(tokens).shape == (3, 9)
    for name in ["roberta", "gpt2", "lstm"]:
        model = language.build_model(name, "softmax", 50, args).eval()
        assert torch.allclose(model(tokens), model(language.trim(tokens)), atol=1e-5)


def test_the_transformers_split_the_width_into_heads_unless_dim_head_says():
    """--dim 32 --heads 4: 4 heads of 8 in each of --depth 2 blocks; --dim-head 16 makes them 4 heads of 16."""
    for extra, dim_head in [([], 8), (["--dim-head", "16"], 16)]:
        args = language.parse_args(["--dim", "32", "--heads", "4", "--depth", "2"] + extra)
        for name in ["roberta", "gpt2"]:
            model = language.build_model(name, "softmax", 50, args)
            blocks = [b for b in model.modules() if isinstance(b, language.Block)]
            assert [(b.heads, b.dim_head) for b in blocks] == [(4, dim_head)] * 2, name


@pytest.mark.parametrize("name,attn", [("roberta", "softmax"), ("roberta", "relu"), ("gpt2", "softmax"),
                                       ("lstm", "softmax")])
def test_models_ignore_padding(name, attn):
    """Logits of shape (B, 2), and changing the token at a padded position changes nothing."""
    args = language.parse_args(["--dim", "32", "--heads", "4", "--depth", "2", "--max-len", "16"])
    torch.manual_seed(0)
    model = language.build_model(name, attn, 50, args).eval()
    tokens = torch.randint(4, 50, (3, 16))
    tokens[0, 10:] = language.PAD
    tokens[1, 5:] = language.PAD
    out = model(tokens)
    assert out.shape == (3, 2)
    e = model.embed_normed(tokens)
    e2 = e.clone()
    e2[0, 12] += 5.0  # perturb a padded position's (normalised) embedding
    e2[1, 9] -= 3.0
    mask = tokens != language.PAD
    assert torch.allclose(model.forward_normed(e, mask), model.forward_normed(e2, mask), atol=1e-5)


def test_hand_written_lstm_matches_torch():
    """The LSTM layer equals torch.nn.LSTM with the same weights; --fused runs that and gives the same logits."""
    torch.manual_seed(0)
    layer = language.LSTMLayer(8, 16)
    ref = nn.LSTM(8, 16, batch_first=True)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(layer.W_ih)
        ref.weight_hh_l0.copy_(layer.W_hh)
        ref.bias_ih_l0.copy_(layer.b_ih)
        ref.bias_hh_l0.copy_(layer.b_hh)
    x = torch.randn(4, 7, 8)
    assert torch.allclose(layer(x), ref(x)[0], atol=1e-6)
    model = language.LSTMClassifier(30, 16, 3, 0.0).eval()
    tokens = torch.randint(4, 30, (5, 9))
    tokens[2, 6:] = language.PAD
    plain = model(tokens)
    n_params = len(list(model.parameters()))
    model.fused = True
    assert torch.allclose(plain, model(tokens), atol=1e-5)
    assert torch.allclose(plain, model(tokens), atol=1e-5)  # the cached torch.nn.LSTM shell, second call
    assert len(list(model.parameters())) == n_params  # its own weights are not the model's


def test_lstm_initialisation_and_dropout_are_torchs():
    """Every LSTM weight starts uniform on [-1/sqrt(H), 1/sqrt(H)] as torch.nn.LSTM's; dropout acts on the embeddings,
    between layers (not before the first) and before the head, in the hand-written and the fused path alike (the
    fused torch.nn.LSTM drops between its layers only when there are several); --fused reaches the model."""
    torch.manual_seed(0)
    layer = language.LSTMLayer(64, 256)
    for w in [layer.W_ih, layer.W_hh, layer.b_ih, layer.b_hh]:
        assert w.abs().max() <= 256**-0.5 and w.min() < -0.9 * 256**-0.5 and w.max() > 0.9 * 256**-0.5
        assert w.std().item() == pytest.approx(256**-0.5 / 3**0.5, rel=0.1)  # uniform: half-width / sqrt(3)

    class Double(nn.Module):  # a dropout whose effect is known: it doubles what it is given
        def forward(self, x):
            return 2 * x

    model = language.LSTMClassifier(30, 8, 2, 0.5).train()
    model.drop = Double()
    tokens = torch.randint(4, 30, (3, 6))
    e, mask = model.embed_normed(tokens), tokens != language.PAD
    x = model.layers[1](2 * model.layers[0](2 * e))
    assert torch.allclose(model.forward_normed(e, mask), model.head(2 * x[:, -1]), atol=1e-6)
    for depth in [1, 2]:
        fused = language.LSTMClassifier(30, 8, depth, 0.3, fused=True).train()
        fused(tokens)
        assert fused._fused[tokens.device].dropout == (0.3 if depth > 1 else 0.0)
    args = language.parse_args(["--task", "fake", "--fused"])
    assert language.build_model("lstm", "softmax", 30, args).fused


class LastToken(nn.Module):
    """A stand-in with the models' interface: the label is the sign of the last real token's first coordinate."""

    def embed_normed(self, tokens):
        return (tokens != language.PAD).float()[..., None].expand(-1, -1, 3) * 0.5

    def forward_normed(self, e, mask):
        v = e[torch.arange(len(e)), mask.sum(1) - 1, 0]
        return torch.stack([torch.zeros_like(v), v], 1)

    def prefix_cache(self, e, mask):
        return None  # like the bidirectional encoder: no prefix to reuse


def test_right_aligned_profile_counts_from_the_end():
    tokens = torch.full((4, 10), language.PAD)
    for i, n in enumerate([3, 5, 8, 10]):
        tokens[i, :n] = 5
    right, right_pairs = language.measure_sensitivity(LastToken(), tokens, sigma=1.0, reps=50, positions=None,
                                                             align="right", seed=0)
    assert right.per_position[-1] > 0.2 and (right.per_position[:-1] == 0).all()
    left, left_pairs = language.measure_sensitivity(LastToken(), tokens, sigma=1.0, reps=50, positions=None,
                                                           align="left", seed=0)
    assert set(torch.nonzero(left.per_position > 0).flatten().tolist()) == {2, 4, 7, 9}
    assert right_pairs.tolist() == [1, 1, 2, 2, 2, 3, 3, 4, 4, 4]  # pairs of lengths 3, 5, 8, 10 reaching each column
    assert left_pairs.tolist() == right_pairs.flip(0).tolist()
    assert abs(left.mean - right.mean) < 4 * (left.stderr**2 + right.stderr**2) ** 0.5 + 0.02


def test_missing_files_and_offline_download_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"train.tsv.*--download"):
        language.read_tsv(str(tmp_path / "MRPC" / "train.tsv"), "mrpc")
    (tmp_path / "bad.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(ValueError, match="not a GLUE MRPC file: no column '#1 String' in its header"):
        language.read_tsv(str(tmp_path / "bad.tsv"), "mrpc")  # the first of the three it lacks
    write_mrpc(tmp_path / "MRPC", PAIRS, "cut.tsv")  # a download cut off inside the last sentence of the last row
    path = tmp_path / "MRPC" / "cut.tsv"
    path.write_text(path.read_text()[:-8])
    with pytest.raises(ValueError, match=r"cut.tsv ends inside its last row \(line 5\)"):
        language.read_tsv(str(path), "mrpc")

    def offline(*a, **k):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlretrieve", offline)
    with pytest.raises(FileNotFoundError, match="cannot download") as e:  # each split's files, as read_tsv says
        language.download("mrpc", str(tmp_path))
    assert str(e.value).endswith("Without a network, put the MRPC files (--split paper: msr_paraphrase_train.txt, "
                                 f"msr_paraphrase_test.txt; --split glue: train.tsv, dev.tsv) in {tmp_path / 'MRPC'}")


@pytest.mark.slow
def test_mrpc_runs_on_the_papers_split_by_default(tmp_path):
    """The paper trains on the Microsoft release's own 4,076 training pairs and tests on its 1,725 (the files
    msr_paraphrase_{train,test}.txt); --split glue reads GLUE's train.tsv and dev.tsv. The test set's majority-class
    share (what a constant classifier scores) is recorded beside the accuracies."""
    write_mrpc(tmp_path / "MRPC", PAIRS * 5, "msr_paraphrase_train.txt")
    write_mrpc(tmp_path / "MRPC", PAIRS[:3], "msr_paraphrase_test.txt")  # labels 1, 0, 1: majority 2/3
    write_mrpc(tmp_path / "MRPC", PAIRS * 2, "train.tsv")
    write_mrpc(tmp_path / "MRPC", [PAIRS[1], PAIRS[3], PAIRS[1], PAIRS[0]], "dev.tsv")  # labels 0, 0, 0, 1
    argv = ["--data-dir", str(tmp_path), "--model", "lstm", "--dim", "8", "--depth", "1", "--epochs", "1",
            "--n-sens", "2", "--eval-every", "100", "--out-dir", str(tmp_path)]
    paper = language.main(language.parse_args(argv + ["--run-name", "p"]))["data"]
    assert paper == {"split": "paper", "n_train": 20, "n_test": 3, "test_majority": pytest.approx(2 / 3)}
    glue = language.main(language.parse_args(argv + ["--run-name", "g", "--split", "glue"]))["data"]
    assert glue == {"split": "glue", "n_train": 8, "n_test": 4, "test_majority": 0.75}  # the majority class is 0


def test_main_downloads_when_asked_checks_sens_test_and_saves_the_pairs(tmp_path, monkeypatch, capsys):
    """--download fetches the task's files into --data-dir first; --sens-test with more --n-sens than test pairs is an
    error naming the flag; the fake task is 400 training and 100 test pairs, none shared, of 50 words, labelled by
    whether the second sentence starts with the first one's first word; the paired differences reach metrics.json on
    disk and the summary is printed at the end (the data and each model's size at the start, a line per evaluation
    between). Its progress lines count epochs of 13 steps (400 pairs, 32 a step), and name the README's MRPC protocol
    where a run is over an hour on a CPU."""
    asked, made = [], []
    real = runs.Results.progress
    monkeypatch.setattr(runs.Results, "progress", lambda self, *a, **kw: made.append(kw) or real(self, *a, **kw))

    class Fetched(Exception):
        pass

    def download(task, data_dir):
        asked.append((task, data_dir))
        raise Fetched

    monkeypatch.setattr(language, "download", download)
    with pytest.raises(Fetched):
        language.main(language.parse_args(["--download", "--data-dir", str(tmp_path / "glue")]))
    assert asked == [("mrpc", str(tmp_path / "glue"))]
    small = ["--task", "fake", "--dim", "8", "--heads", "2", "--depth", "1", "--epochs", "0.1", "--n-sens", "30",
             "--out-dir", str(tmp_path)]
    with pytest.raises(ValueError, match="--n-sens 30 asks for more than the 20 test pairs"):
        language.main(language.parse_args(small + ["--n-test", "20", "--sens-test", "--run-name", "s"]))
    train, test = language.fake_pairs(400, 0), language.fake_pairs(100, 1)
    assert not {(a, b) for a, b, _ in train} & {(a, b) for a, b, _ in test}
    vocab = {f"w{i}" for i in range(50)}
    for a, b, y in train:  # 3-11 words, then the first word again (label 1) or another one, and 2-9 more words
        assert 3 <= len(a.split()) <= 11 and 3 <= len(b.split()) <= 10 and set(a.split() + b.split()) <= vocab
        assert (a.split()[0] == b.split()[0]) == y
    assert {len(a.split()) for a, _, _ in train} == set(range(3, 12))
    capsys.readouterr()
    data = language.main(language.parse_args(small + ["--model", "lstm", "gpt2", "--run-name", "p"]))
    out = capsys.readouterr().out
    assert "\nlstm (1 seed) | train acc " in out and "\nfinal gpt2-softmax - lstm | sigma 3.87298: " in out, out
    assert "\nfake: 400 train / 100 test pairs (paper split; the majority class is 0.550 of the test pairs), " \
        "vocabulary " in out  # then each model's size, once
    for run in ["lstm/seed0", "gpt2-softmax/seed0"]:
        assert len(re.findall(f"^{run}: [0-9]+[.][0-9][0-9]M parameters$", out, re.M)) == 1, run
        lines = [line for line in out.splitlines() if line.startswith(f"{run} step ")]
        assert len(lines) == len(data["runs"][run]["history"]) and all(" | sens " in line for line in lines), run
    assert "\nwrote " in out and "sensitivity.png" in out  # the figures' paths
    assert data["data"]["n_train"] == 400 and data["data"]["n_test"] == 100
    assert data["data"]["test_majority"] == 0.55  # of these test pairs (0.56 of fake_pairs(100, 0), say)
    assert made == [{"per_epoch": 13, "hint": language.CPU_SIZE}] * 2  # lstm, gpt2
    on_disk = json.loads((tmp_path / "language" / "p" / "metrics.json").read_text())
    assert on_disk["paired"] == strict_json(data["paired"]) and on_disk["paired"]["final"]["models"]


@pytest.mark.slow
def test_end_to_end(tmp_path, monkeypatch):
    calls = loop_calls(monkeypatch)
    write_mrpc(tmp_path / "MRPC", PAIRS * 5, "train.tsv")
    write_mrpc(tmp_path / "MRPC", PAIRS, "dev.tsv")
    argv = ["--data-dir", str(tmp_path), "--model", "roberta", "gpt2", "lstm", "--attn", "softmax", "relu",
            "--dim", "16", "--heads", "2", "--depth", "1", "--max-len", "24", "--epochs", "1", "--batch-size", "5",
            "--eval-every", "2", "--n-sens", "4", "--sens-test", "--out-dir", str(tmp_path), "--run-name", "t",
            "--split", "glue"]
    language.main(language.parse_args(argv))
    folder = tmp_path / "language" / "t"
    data = json.loads((folder / "metrics.json").read_text())
    assert set(data["runs"]) == {"roberta-softmax/seed0", "roberta-relu/seed0", "gpt2-softmax/seed0",
                                 "gpt2-relu/seed0", "lstm/seed0"}
    run = data["runs"]["lstm/seed0"]
    assert [h["step"] for h in run["history"]] == [0, 2, 4] and [h["examples"] for h in run["history"]] == [0, 10, 20]
    assert run["seconds"]["training"] > 0 and run["seconds"]["evaluations"] > 0  # every step timed (--times)
    told = [(step, step % 2 == 0) for step in range(5)] * 5  # five models: what the progress and checkpoints hear
    assert calls["progress"] == [(0, 4, 2)] * 5  # from step 0, 4 steps, evaluating every 2
    assert calls["tick"] == told and calls["checkpoint"] == [(*t, 0) for t in told]
    for key in ["sens", "sens_stderr", "train_acc", "test_acc", "sens_test"]:
        assert isinstance(run["final"][key], float)
    prof, pairs = run["final"]["profiles"]["right"]["sens"], run["final"]["profiles"]["right"]["pairs"]
    assert len(prof) == len(pairs) <= 24
    assert pairs[-1] == 4 and pairs == sorted(pairs)  # right-aligned: every pair has a last token, few a first
    assert all((p != p) == (n == 0) for p, n in zip(prof, pairs))  # NaN exactly where no measured pair reaches
    assert (folder / "sensitivity.png").exists() and (folder / "sensitivity_by_position.png").exists()


@pytest.mark.parametrize("name,attn,fused", [("lstm", "softmax", False), ("lstm", "softmax", True),
                                             ("gpt2", "softmax", False), ("gpt2", "relu", False)])
def test_prefix_cache_gives_exactly_the_uncached_sensitivity(name, attn, fused):
    """The causal models resume from the clean states before the perturbed token (LSTM states, GPT-2 keys and
    values): with the same noise, every pair's flip rate equals the full recomputation's, for both alignments and
    for sampled positions; and the models do flip (a one-layer LSTM with a scaled head: deeper ones are constant at
    initialisation), so the comparison is not vacuous."""
    args = language.parse_args(["--dim", "32", "--heads", "4", "--depth", "1" if name == "lstm" else "2",
                                "--max-len", "40"] + ["--fused"] * fused)
    torch.manual_seed(1)
    model = language.build_model(name, attn, 60, args)
    with torch.no_grad():
        model.head.weight.mul_(30)
    tokens = torch.randint(4, 60, (30, 40), generator=torch.Generator().manual_seed(0))
    tokens[torch.arange(40) >= torch.randint(5, 41, (30, 1), generator=torch.Generator().manual_seed(2))] = language.PAD
    resumed = []  # the copies that resume from the cache: all with prefix_cache, none without
    model.forward_from = lambda e, *a: resumed.append(len(e)) or type(model).forward_from(model, e, *a)
    for align in ["right", "left"]:
        for positions in [None, 3]:
            kw = dict(sigma=2.0, reps=2, positions=positions, align=align, seed=0)
            resumed.clear()
            cached, _ = language.measure_sensitivity(model, tokens, **kw)
            assert sum(resumed) == cached.evaluations, (sum(resumed), cached.evaluations)
            resumed.clear()
            full, _ = language.measure_sensitivity(model, tokens, **kw, prefix_cache=False)
            assert resumed == []
            assert torch.equal(cached.per_input, full.per_input) and cached.evaluations == full.evaluations
            if positions is not None:  # k sampled positions per pair and draw
                assert cached.evaluations == len(tokens) * positions * 2
            assert cached.mean > 0.005, (align, positions, cached.mean)
    assert language.build_model("roberta", attn, 60, args).prefix_cache(torch.zeros(2, 3, 32), None) is None


def test_softmax_and_relu_attention_are_their_formulas():
    """One block on a fixed input equals x + proj(A v) followed by the MLP, where A = softmax(q k^T / sqrt(hs)) or
    relu(q k^T / sqrt(hs)), over real keys only (and, causal, over earlier positions only)."""
    torch.manual_seed(0)
    x, mask = torch.randn(2, 5, 8), torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    for attn in ["softmax", "relu"]:
        for causal in [False, True]:
            block = language.Block(8, 2, 4, 16, 0.0, attn, causal).eval()
            q, k, v = block.qkv(block.ln1(x)).view(2, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-2, -1) / 2  # sqrt(hs) = 2
            keep = mask[:, None, None, :] & (torch.ones(5, 5, dtype=torch.bool).tril() if causal else True)
            a = scores.masked_fill(~keep, float("-inf")).softmax(-1) if attn == "softmax" else scores.relu() * keep
            h = x + block.proj((a @ v).transpose(1, 2).reshape(2, 5, 8))
            assert torch.allclose(block(x, mask), h + block.mlp(block.ln2(h)), atol=1e-5), (attn, causal)
            row = torch.tensor([4, 2])  # one token of each sequence alone: its row of the whole block's output
            assert torch.allclose(block(x, mask, row), block(x, mask)[torch.arange(2), row, None], atol=1e-5)
    relu, soft = language.Block(8, 2, 4, 16, 0.0, "relu", False), language.Block(8, 2, 4, 16, 0.0, "softmax", False)
    soft.load_state_dict(relu.state_dict())
    assert not torch.allclose(relu(x, mask), soft(x, mask), atol=1e-3)


@pytest.mark.parametrize("name,attn", [("roberta", "softmax"), ("roberta", "relu"), ("gpt2", "softmax")])
def test_an_evaluating_transformer_computes_only_the_read_token_in_its_last_block(name, attn):
    """The head reads one token (RoBERTa <s>, GPT-2 the last real one), so evaluating, the last block computes that
    token alone: the logits of every token's computation up to float rounding, and its predictions, on pairs of
    several lengths. Training computes every token, with the same dropout draws as before."""
    args = language.parse_args(["--dim", "32", "--heads", "4", "--depth", "2", "--max-len", "16"])
    torch.manual_seed(0)
    model = language.build_model(name, attn, 50, args)
    tokens = torch.randint(4, 50, (64, 16), generator=torch.Generator().manual_seed(0))
    tokens[torch.arange(16) >= torch.randint(2, 17, (64, 1), generator=torch.Generator().manual_seed(1))] = language.PAD
    mask = tokens != language.PAD
    read = mask.sum(1) - 1 if name == "gpt2" else torch.zeros(64, dtype=torch.long)

    def every_token(e):
        x = model.drop(e + model.pos.weight[:16])
        for block in model.blocks:
            x = block(x, mask)
        return model.head(model.ln_f(x)[torch.arange(64), read])

    with torch.no_grad():
        model.head.weight.mul_(30)  # logits far from 0, so that a wrong token read changes predictions
        e = model.embed_normed(tokens)
        alone, full = model.eval()(tokens), every_token(e)
        assert torch.allclose(alone, full, atol=1e-4) and torch.equal(alone.argmax(1), full.argmax(1))
        assert full.argmax(1).float().mean() not in (0.0, 1.0)  # both classes: not a vacuous comparison
        model.train()
        torch.manual_seed(2)
        trained = model(tokens)
        torch.manual_seed(2)
        assert torch.equal(trained, every_token(e))


def test_causal_model_never_sees_later_tokens():
    """GPT-2 attends only to earlier positions: changing tokens 4 and 5 leaves the prediction read at token 3
    unchanged, and changes the one read at token 5."""
    args = language.parse_args(["--dim", "16", "--heads", "2", "--depth", "2", "--max-len", "12"])
    torch.manual_seed(0)
    model = language.build_model("gpt2", "softmax", 30, args).eval()
    e = torch.randn(1, 6, 16)
    mask = torch.ones(1, 6, dtype=torch.bool)
    early = model.forward_normed(e[:, :4], mask[:, :4])
    e2 = e.clone()
    e2[:, 4:] += 3.0 * torch.randn(1, 2, 16)  # (a constant shift would vanish in the LayerNorm)
    assert torch.allclose(early, model.forward_normed(e2[:, :4], mask[:, :4]))
    assert not torch.allclose(model.forward_normed(e, mask), model.forward_normed(e2, mask))


class Says(nn.Module):
    """A model that always answers class k."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, tokens):
        return torch.log(torch.tensor([0.2, 0.8] if self.k else [0.8, 0.2])).expand(len(tokens), 2)


def test_length_buckets_give_exactly_the_padded_answers():
    """RoBERTa's perturbed copies run in groups of similar length, each cut to its longest, and evaluate() batches
    the pairs sorted by length: every pair's flip rate, the loss, the accuracy and the majority share equal those of
    the whole padded batch, on pairs of lengths 5 to 40 (and the model does flip, so the check is not vacuous); the
    groups do run shorter, and `buckets=False` runs the padded batch."""
    args = language.parse_args(["--dim", "32", "--heads", "4", "--depth", "2", "--max-len", "40"])
    torch.manual_seed(1)
    model = language.build_model("roberta", "softmax", 60, args).eval()
    with torch.no_grad():
        model.head.weight.mul_(30)
    tokens = torch.randint(4, 60, (30, 40), generator=torch.Generator().manual_seed(0))
    tokens[torch.arange(40) >= torch.randint(5, 41, (30, 1), generator=torch.Generator().manual_seed(2))] = language.PAD
    widths, forward_normed = [], model.forward_normed

    def seen(e, mask, *rest):  # the width of every batch the model runs
        widths.append(e.shape[1])
        return forward_normed(e, mask, *rest)
    model.forward_normed = seen
    for align, positions in [("right", None), ("left", 3)]:
        kw = dict(sigma=2.0, reps=2, positions=positions, align=align, seed=0)
        grouped, _ = language.measure_sensitivity(model, tokens, **kw)
        assert min(widths) < 20  # the groups are cut to their longest: short pairs run short
        widths.clear()
        padded, _ = language.measure_sensitivity(model, tokens, **kw, buckets=False)
        assert set(widths) == {int((tokens != language.PAD).sum(1).max())}  # one batch per chunk, cut to the longest
        widths.clear()
        assert torch.equal(grouped.per_input, padded.per_input) and grouped.mean > 0.005
    labels = torch.randint(2, (30,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(tokens)  # one batch, padded to 40
    loss, acc, share = language.evaluate(model, tokens, labels, batch_size=7)
    assert loss == pytest.approx(F.cross_entropy(out, labels).item(), rel=1e-5)
    assert acc == (out.argmax(1) == labels).float().mean().item()
    assert share == out.argmax(1).bincount(minlength=2).max().item() / 30


def test_evaluate_gives_the_known_loss_accuracy_and_majority_share():
    """Always class 1 with p = 0.8: accuracy = share of label 1, loss = -(n1 log 0.8 + n0 log 0.2) / n, and all
    pairs get the one class (majority share 1); on a CPU the pairs go through the model 64 at a time (256 on a GPU)."""
    tokens = torch.randint(4, 20, (10, 6))
    labels = torch.tensor([1] * 7 + [0] * 3)
    loss, acc, share = language.evaluate(Says(1), tokens, labels)
    assert acc == 0.7 and share == 1.0
    assert loss == pytest.approx(-(7 * math.log(0.8) + 3 * math.log(0.2)) / 10, rel=1e-6)
    model = Says(1)
    sizes = forward_sizes(model)
    assert language.evaluate(model, tokens.repeat(15, 1), labels.repeat(15)) == (pytest.approx(loss, rel=1e-6), acc,
                                                                                  share)
    assert sizes == [64, 64, 22]

    class FirstTokenIsFive(nn.Module):  # class 1 exactly for the pairs that start with token 5
        def forward(self, tokens):
            return torch.stack([torch.zeros(len(tokens)), (tokens[:, 0] == 5).float() * 2 - 1], 1)

    tokens[:, 0] = 4
    tokens[8:, 0] = 5  # batches of 2: the first four see class 0 only, the last class 1 only
    assert language.evaluate(FirstTokenIsFive(), tokens, labels, batch_size=2)[2] == 0.8


def test_mrpc_download_puts_every_pair_in_exactly_one_split(tmp_path, monkeypatch):
    """GLUE's rule: the pairs listed in dev_ids.tsv form dev.tsv, all the others train.tsv; disjoint, complete. The
    Microsoft file's byte-order mark stays out of both, a bare quote stays in its sentence, and a row of another
    number of fields is an error naming its line."""
    rows = [f"{i % 2}\t{100 + i}\t{200 + i}\tsentence a {i}\tsentence b {i}" for i in range(10)]
    rows[3] = rows[3].replace("sentence a 3", '"yes" he said')
    files = {"msr_paraphrase_train.txt": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "\n".join(rows) +
             "\n", "msr_paraphrase_test.txt": "", "dev_ids.tsv": "102\t202\n107\t207\n"}
    monkeypatch.setattr(urllib.request, "urlretrieve", lambda url, path: open(path, "w", encoding="utf-8").write(
        files[os.path.basename(path)]))
    language.download("mrpc", str(tmp_path))
    train = language.read_tsv(str(tmp_path / "MRPC" / "train.tsv"), "mrpc")
    dev = language.read_tsv(str(tmp_path / "MRPC" / "dev.tsv"), "mrpc")
    assert [a for a, _, _ in dev] == ["sentence a 2", "sentence a 7"] and len(train) == 8
    assert not {a for a, _, _ in train} & {a for a, _, _ in dev}
    assert '"yes" he said' in [a for a, _, _ in train]
    assert all((tmp_path / "MRPC" / f).read_bytes().startswith(b"Quality\t") for f in ["train.tsv", "dev.tsv"])
    files["msr_paraphrase_train.txt"] += "1\t300\t400\tone\ttwo\tthree\n"
    with pytest.raises(ValueError, match=r"msr_paraphrase_train.txt line 12 has 6 tab-separated fields, expected 5"):
        language.download("mrpc", str(tmp_path))


def test_qqp_download_and_the_rows_a_glue_file_may_not_have(tmp_path, monkeypatch):
    """QQP: train.tsv and dev.tsv come out of GLUE's archive, and an archive without them is named. A GLUE file
    that starts with a byte-order mark reads as one without; a header without rows, or a row with more fields than
    the header, is an error naming the file."""
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
    archive = tmp_path / "made.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("QQP/train.tsv", header + "0\t1\t2\tWhy?\tHow?\t0\n1\t3\t4\tWho?\tWhom?\t1\n")
        z.writestr("QQP/dev.tsv", header + "2\t5\t6\tWhat?\tWhat?\t1\n")
    monkeypatch.setattr(urllib.request, "urlretrieve", lambda url, path: shutil.copy(archive, path))
    language.download("qqp", str(tmp_path / "glue"))
    assert language.read_tsv(str(tmp_path / "glue" / "QQP" / "train.tsv"), "qqp") == [("Why?", "How?", 0),
                                                                                        ("Who?", "Whom?", 1)]
    assert language.read_tsv(str(tmp_path / "glue" / "QQP" / "dev.tsv"), "qqp") == [("What?", "What?", 1)]
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("QQP/train.tsv", header)
    with pytest.raises(ValueError, match=r"QQP-clean.zip is not GLUE's QQP archive"):
        language.download("qqp", str(tmp_path / "other"))
    for name, text, message in [
            ("bom.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\n", None),
            ("empty.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n", "empty.tsv holds no sentence pairs"),
            ("long.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\tc\n",
             "line 2 has 6 fields, not the header's 5")]:
        (tmp_path / name).write_text(text, encoding="utf-8")
        if message is None:
            assert language.read_tsv(str(tmp_path / name), "mrpc") == [("a", "b", 1)]
        else:
            with pytest.raises(ValueError, match=message):
                language.read_tsv(str(tmp_path / name), "mrpc")


@pytest.mark.slow
def test_a_short_run_learns_a_separable_task(tmp_path):
    """Label 1 iff sentence A starts with "yes": the encoder reaches train and test accuracy 1 within 90 steps,
    and its sensitivity falls from initialisation to the end."""
    pairs = [(("yes " if i % 2 else "no ") + f"the cat sat {i % 7} on the mat", f"a dog ran {i % 5}", i % 2)
             for i in range(48)]
    write_mrpc(tmp_path / "MRPC", pairs, "msr_paraphrase_train.txt")  # the paper's split, the default
    write_mrpc(tmp_path / "MRPC", pairs[:16], "msr_paraphrase_test.txt")
    argv = ["--data-dir", str(tmp_path), "--model", "roberta", "--dim", "32", "--heads", "2", "--depth", "1",
            "--epochs", "15", "--batch-size", "8", "--lr", "3e-3", "--eval-every", "90", "--n-sens", "16",
            "--out-dir", str(tmp_path)]
    run = language.main(language.parse_args(argv))["runs"]["roberta-softmax/seed0"]
    assert run["final"]["train_acc"] == 1.0 and run["final"]["test_acc"] == 1.0
    assert run["history"][0]["majority_share"] >= 0.5 and run["final"]["majority_share"] == 0.5


def test_paired_differences_are_against_the_first_model_asked_for():
    """The reference of the paired differences is the first model of --model present in the runs, whatever order
    the runs were recorded in: here roberta-softmax, and lstm - roberta-softmax is the per-pair difference. Without
    a --model, the first model recorded."""
    def run(per_pair):
        return {"history": [], "final": {"per_image": {"2": per_pair}, "per_image_init": {"2": per_pair}}}
    runs = {"lstm/seed0": run([0.5, 0.25]), "roberta-softmax/seed0": run([0.25, 0.0])}
    p = report.language_paired({"args": {"model": ["roberta", "lstm"], "attn": ["softmax"]}, "runs": runs})
    assert p["final"]["reference"] == p["init"]["reference"] == "roberta-softmax"
    assert p["final"]["models"]["lstm"]["diff"]["2"]["mean"] == pytest.approx(0.25)
    p = report.language_paired({"runs": runs})  # no --model recorded (a hand-made metrics.json): the first run's
    assert p["final"]["reference"] == "lstm" and list(p["final"]["models"]) == ["roberta-softmax"]
    assert report.language_paired({"runs": {}})["final"] == {"reference": None, "models": {}}  # nothing finished yet


def test_profile_windows_count_from_the_right_end_and_skip_rare_positions():
    """C7's readout: the right-aligned profile is read from its last token (stored last), a window averages only the
    positions a quarter of the pairs reach, then the mean and s.e. over seeds."""
    def run(last, rare):  # 41 positions: the last token flips `last`, every other 0.1, the rarest `rare`
        right = {"sens": [rare] + [0.1] * 39 + [last], "pairs": [9] + [40] * 40}  # 9 pairs: under a quarter of 40
        left = {"sens": [last] + [0.0] * 40, "pairs": [40] * 40 + [9]}
        return {"history": [], "final": {"profiles": {"right": right, "left": left}}}
    w = report.profile_windows({"runs": {"lstm/seed0": run(0.2, 9.0), "lstm/seed1": run(0.4, 9.0)}})["lstm"]
    assert w["last 10"][0] == pytest.approx((0.3 + 9 * 0.1) / 10)  # seeds' last tokens 0.2 and 0.4
    assert w["last 10"][1] == pytest.approx(0.01) and w["last 10"][2] == 2
    assert w["beyond 30"][0] == pytest.approx(0.1)  # the position 9 of 40 pairs reach (9.0) is left out
    assert w["<s>"][0] == pytest.approx(0.3) and w["positions 1-39"][0] == 0
    for unsampled in [None, math.nan]:  # --sens-positions: positions not measured (NaN in the run, None once saved)
        r = run(0.2, 9.0)
        r["final"]["profiles"]["right"]["sens"][-2] = unsampled
        assert report.profile_windows({"runs": {"lstm/seed0": r}})["lstm"]["last 10"][0] == pytest.approx(1 / 9)


def test_through_training_means_seeds_at_each_evaluation():
    runs = [{"history": [{"examples": 0, "sens": 0.1}, {"examples": 64, "sens": 0.3}]},
            {"history": [{"examples": 0, "sens": 0.3}, {"examples": 64, "sens": 0.3}]}]
    (x0, m0, se0, n0), (x1, m1, se1, _) = report.through_training(runs)
    assert (x0, x1, n0) == (0, 64, 2) and m0 == pytest.approx(0.2) and se0 == pytest.approx(0.1)
    assert m1 == pytest.approx(0.3) and se1 == 0


def test_language_summary_prints_accuracy_against_majority_and_per_seed_differences(capsys):
    """The summary of a finished run, and of a stopped one (no "paired" saved yet: computed from its finished runs)."""
    def run(model, seed, per_pair):
        init = {"examples": 0, "sens": per_pair[0], "sens@2": per_pair[0], "majority_share": 1.0}
        return {"model": model, "seed": seed, "history": [init],
                "final": {"train_acc": 0.9 + seed / 20, "test_acc": 0.6, "majority_share": 0.5,
                          "sens_at": {"2": {"sens": per_pair[1]}}, "per_image": {"2": per_pair},
                          "per_image_init": {"2": per_pair}}}
    runs = {"roberta-softmax/seed0": run("roberta-softmax", 0, [0.0, 0.0]),
            "roberta-softmax/seed1": run("roberta-softmax", 1, [0.0, 0.0]),
            "lstm/seed0": run("lstm", 0, [0.5, 0.5]), "lstm/seed1": run("lstm", 1, [0.25, 0.25])}
    for seed, last in enumerate([0.2, 0.4]):  # the LSTM's right-aligned profiles: its last token flips 0.2 and 0.4
        runs[f"lstm/seed{seed}"]["final"]["profiles"] = {"right": {"sens": [0.0] * 9 + [last], "pairs": [4] * 10}}
    data = {"script": "language", "args": {"model": ["roberta", "lstm"], "attn": ["softmax"]},
            "data": {"test_majority": 0.665}, "runs": runs}
    data["paired"] = report.language_paired(data)
    report.summary(data)
    out = capsys.readouterr().out
    assert ("lstm (2 seeds) | train acc 0.925 +- 0.025 | test acc 0.600 +- 0.000 | majority class 0.665 | "
            "majority share init 1.000 +- 0.000 end 0.500 +- 0.000 | sigma 2 init 0.3750 +- 0.1250 final "
            "0.3750 +- 0.1250") in out
    assert "final lstm - roberta-softmax | sigma 2: +0.3750 +- 0.1250 (2 seeds) per seed +0.5000, +0.2500" in out
    assert "lstm sensitivity by examples seen | 0: 0.3750 +- 0.1250" in out
    assert "lstm profile | last 10 0.0300 +- 0.0100\n" in out  # the mean over 10 positions, then over seeds
    del data["paired"]  # a stopped run's folder (report.py on it): paired here, against the first of its --model
    report.summary(data)
    assert "final lstm - roberta-softmax | sigma 2: +0.3750 +- 0.1250 (2 seeds)" in capsys.readouterr().out


def test_by_length_groups_similar_lengths_and_keeps_row_order():
    """Rows run in groups whose shortest length is at least `slack` times the longest, longest first, and each
    output lands back on its own row."""
    length = torch.tensor([6, 1, 10, 3, 9, 7])
    groups = []

    def run(rows):
        groups.append(sorted(length[rows].tolist(), reverse=True))
        return length[rows, None] * 10.0

    out = language.by_length(run, length, slack=0.65)
    assert groups == [[10, 9, 7], [6], [3], [1]]
    assert torch.equal(out, length[:, None] * 10.0)


@pytest.mark.parametrize("name,attn,fused", [("lstm", "softmax", False), ("lstm", "softmax", True),
                                             ("gpt2", "softmax", False), ("gpt2", "relu", False)])
def test_forward_from_gives_the_full_forward_logits(name, attn, fused):
    """Resuming from the clean cache at any start (the first token, the second, the middle, the last real one) gives the
    logits of the full forward pass on the perturbed inputs, and prefix_cache's own logits are the clean ones. GPT-2's
    last block computes the last real token alone (the one the head reads)."""
    args = language.parse_args(["--dim", "16", "--heads", "2", "--depth", "2", "--max-len", "12"] + ["--fused"] * fused)
    torch.manual_seed(0)
    model = language.build_model(name, attn, 30, args).eval()
    tokens = torch.randint(4, 30, (4, 12), generator=torch.Generator().manual_seed(0))
    tokens[torch.arange(12) >= torch.tensor([[12], [7], [3], [1]])] = language.PAD
    mask = tokens != language.PAD
    with torch.no_grad():
        e = model.embed_normed(tokens)
        cache, clean = model.prefix_cache(e, mask)
        assert torch.allclose(clean, model.forward_normed(e, mask), atol=1e-5)
        idx = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3])
        start = torch.tensor([0, 5, 11, 0, 6, 2, 1, 0])
        x = e[idx].clone()
        x[torch.arange(len(idx)), start] += 3 * torch.randn(len(idx), 16, generator=torch.Generator().manual_seed(1))
        full = model.forward_normed(x, mask[idx])
        assert not torch.allclose(full, clean[idx], atol=1e-3)  # the noise moves the logits: not a vacuous check
        rows = []  # the (copies, tokens) that GPT-2's last MLP computes
        if name == "gpt2":
            model.blocks[-1].mlp.register_forward_hook(lambda m, i, o: rows.append(tuple(i[0].shape[:2])))
        through_torch, run_fused = [], getattr(model, "run_fused", None)  # the LSTM's torch.nn.LSTM path
        if run_fused is not None:
            model.run_fused = lambda *a: through_torch.append(a[0].shape) or run_fused(*a)
        assert torch.allclose(model.forward_from(x, mask[idx], start, cache, idx), full, atol=1e-5)
        assert rows == ([(len(idx), 1)] if name == "gpt2" else [])
        assert bool(through_torch) == fused  # --fused resumes through torch.nn.LSTM, the hand-written cells without
        if name == "gpt2":  # its own flag alone (the dropout stays off): every suffix token, as bench.py times it
            model.training = True
            assert torch.allclose(model.forward_from(x, mask[idx], start, cache, idx), full, atol=1e-5)
            assert rows[1:] == [(len(idx), 12)]  # the longest suffix: the 12 tokens of row 0
            model.training = False
        first = start == 0  # a group that starts at the first token reads no cached key at all
        assert torch.allclose(model.forward_from(x[first], mask[idx[first]], start[first], cache, idx[first]),
                              full[first], atol=1e-5)


def test_the_fake_task_is_learnable_pairs_made_offline():
    """--task fake: made-up pairs whose label says whether B starts with A's first word, the same for a seed."""
    pairs = language.fake_pairs(200, 0)
    assert len(pairs) == 200 and pairs == language.fake_pairs(200, 0) and pairs != language.fake_pairs(200, 1)
    assert all((a.split()[0] == b.split()[0]) == bool(y) for a, b, y in pairs)
    assert 60 < sum(y for *_, y in pairs) < 140  # both labels


def test_sens_during_needed_measures_every_sigma_at_the_two_ends_only(tmp_path):
    """--sens-during needed: every --sigma at initialisation and at the end, the headline sigma alone between (on
    the training pairs and, with --sens-test, the test pairs); the training, the headline curve and every final and
    initial number (the paired differences' inputs, the profiles) equal those of the default run, which measures every
    sigma at every evaluation."""
    argv = ["--task", "fake", "--model", "roberta", "--dim", "16", "--heads", "2", "--depth", "1", "--eval-every",
            "4", "--epochs", "1", "--lr", "1e-3", "--n-sens", "30", "--sens-positions", "3", "--sigma", "3", "30",
            "--align", "right", "left", "--sens-test", "--out-dir", str(tmp_path)]
    flags = {"every": [], "needed": ["--sens-during", "needed"]}  # every: the default
    runs = {mode: language.main(language.parse_args(argv + flags[mode] + ["--run-name", mode]))["runs"]
            ["roberta-softmax/seed0"] for mode in flags}
    every, needed = runs["every"]["history"], runs["needed"]["history"]
    assert [h["step"] for h in needed] == [0, 4, 8, 12, 13]
    assert all("sens@30" in h and "sens_test@30" in h for h in every)  # the default: every sigma, every evaluation
    for a, b in zip(every, needed):
        mid = b["step"] not in (0, 13)
        assert ("sens@30" in b) == ("sens_test@30" in b) == (not mid) and "sens@3" in b and "sens_test@3" in b
        assert {k: v for k, v in a.items() if k != "time" and not (mid and k.endswith("@30"))} == \
            {k: v for k, v in b.items() if k != "time"}
    assert strict_json(runs["needed"]["final"]) == strict_json(runs["every"]["final"])  # (NaN as null)
    assert needed[-1]["sens@30"] > needed[0]["sens@3"] > 0  # not vacuous: flips at both sigmas


def test_training_and_its_measurements_replay_by_hand(tmp_path, monkeypatch):
    """Eight AdamW steps of one run (two epochs of 4 batches of 8 pairs, dropout on), replayed here from the flags:
    a new order of the pairs at each epoch from the generator seeded with --seeds, the trimmed batch, --lr and
    --weight-decay, fresh gradients each step, so the same training loss after every step; the initial model's
    per-pair flips kept for the paired comparison at initialisation, and the final ones, 6 digits each; the final
    profile in each --align; the time of each evaluation. A fractional --epochs that rounds to no step still trains
    one."""
    argv = ["--task", "fake", "--n-train", "30", "--n-test", "20", "--model", "roberta", "--dim", "16", "--heads",
            "2", "--depth", "1", "--max-len", "24", "--batch-size", "8", "--epochs", "2", "--eval-every", "1",
            "--lr", "3e-3", "--weight-decay", "0.5", "--seeds", "2", "--n-sens", "6", "--sigma", "0.5", "30",
            "--align", "right", "left", "--out-dir", str(tmp_path), "--run-name", "r"]
    args = language.parse_args(argv)
    stepped = optimizer_steps(monkeypatch, torch.optim.AdamW)  # 8, none after the last evaluation
    t0 = time.time()
    run = language.main(args)["runs"]["roberta-softmax/seed2"]
    wall = time.time() - t0
    monkeypatch.undo()
    assert len(stepped) == 8
    assert [h["step"] for h in run["history"]] == list(range(9))
    assert [h["examples"] for h in run["history"]] == [0, 8, 16, 24, 30, 38, 46, 54, 60]  # the last batch of 6
    times = [h["time"] for h in run["history"]]
    assert 0 <= times[0] and times == sorted(times) and times[-1] <= wall

    train = language.fake_pairs(400, 0)[:30]
    tok = language.Tokenizer([t for a, b, _ in train for t in (a, b)], args.vocab_size)
    x, y = language.encode(train, tok, args.max_len)
    seed_all(2)
    model = language.build_model("roberta", "softmax", len(tok.itos), args)

    def flips(model):  # per pair at every --sigma, 6 digits, as metrics.json keeps them
        return {k: [round(v, 6) for v in s.per_input.tolist()]
                for k, (s, _) in language.sensitivities(model, x[:6], args, "right").items()}

    init = flips(model)
    assert run["final"]["per_image_init"] == init
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.5)
    order = torch.Generator().manual_seed(2)
    for step in range(8):
        if step % 4 == 0:
            perm = torch.randperm(30, generator=order)
        idx = perm[step % 4 * 8:][:8]
        model.train()
        loss = F.cross_entropy(model(language.trim(x[idx])), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert run["history"][step + 1]["train_loss"] == language.evaluate(model, x, y)[0], step
    assert len({h["train_loss"] for h in run["history"]}) == 9  # the model moved at every step

    def same(a, b):  # profiles hold NaN where no measured pair reaches a position
        return torch.equal(torch.tensor(a).nan_to_num(-1), torch.tensor(b).nan_to_num(-1))

    final = flips(model)
    assert run["final"]["per_image"] == final and final != init
    profiles = {}
    for align, sigma in [("right", 0.5), ("left", 0.5), ("left", 30)]:
        s, pairs = language.measure_sensitivity(model, x[:6], sigma=sigma, reps=1, positions=None, align=align,
                                                seed=0)
        profiles[align, sigma] = s.per_position.tolist(), pairs.tolist()
    for align in ["right", "left"]:  # at the headline sigma
        assert same(run["final"]["profiles"][align]["sens"], profiles[align, 0.5][0])
        assert run["final"]["profiles"][align]["pairs"] == profiles[align, 0.5][1]
    # not vacuous: the alignments differ, and so do the left profiles at the two sigmas
    assert not same(profiles["right", 0.5][0], profiles["left", 0.5][0])
    assert not same(profiles["left", 0.5][0], profiles["left", 30][0])

    short = language.main(language.parse_args(argv[:-4] + ["--epochs", "0.01", "--out-dir", str(tmp_path),
                                                           "--run-name", "short"]))
    assert [h["step"] for h in short["runs"]["roberta-softmax/seed2"]["history"]] == [0, 1]


def test_flag_edges_an_older_folder_and_the_tokenizers_ties(tmp_path):
    """--max-len 8 holds the four specials and four words (7 is refused); a --dim that --heads does not divide is
    fine with --dim-head; a folder written before --split existed resumes on GLUE's split (the only one there was),
    one that saved its split keeps it. The vocabulary is the 4 specials and exactly --vocab-size words, ties in
    first-seen order; a pair of two equally long sentences that does not fit loses a word of the first one first."""
    assert language.parse_args(["--max-len", "8"]).max_len == 8
    assert language.parse_args(["--dim", "250", "--heads", "8", "--dim-head", "32"]).dim_head == 32
    for bad in [["--max-len", "7"], ["--dim", "250", "--heads", "8"]]:
        with pytest.raises(SystemExit):
            language.parse_args(bad)
    for saved, split in [({}, "glue"), ({"split": "paper"}, "paper")]:
        (tmp_path / split).mkdir()
        metrics = {"script": "language", "args": {"task": "mrpc", **saved}, "runs": {}}
        (tmp_path / split / "metrics.json").write_text(json.dumps(metrics))
        assert language.parse_args(["--resume", str(tmp_path / split)]).split == split
    tok = language.Tokenizer(["b a c", "a b d"], size=2)  # a and b twice each, b seen first
    assert tok.itos == ["<pad>", "<s>", "</s>", "<unk>", "b", "a"]
    tok = language.Tokenizer(["a b c d e f"], size=100)
    seq = tok.encode_pair("a b c", "d e f", max_len=9)
    assert tok.decode(seq) == ["<s>", "a", "b", "</s>", "</s>", "d", "e", "f", "</s>"]


def test_sens_test_measures_the_first_n_sens_test_pairs_and_fractional_epochs_round(tmp_path, monkeypatch):
    """--sens-test measures the first --n-sens test pairs, as the training measurement takes the first --n-sens
    training pairs; --epochs 0.75 of 13 steps per epoch (400 pairs in batches of 32) is round(9.75) = 10 steps."""
    measured = []
    real = language.sensitivities
    monkeypatch.setattr(language, "sensitivities",
                        lambda model, tokens, *a, **kw: measured.append(tokens.cpu()) or real(model, tokens, *a, **kw))
    argv = ["--task", "fake", "--model", "lstm", "--dim", "8", "--depth", "1", "--epochs", "0.75", "--batch-size",
            "32", "--eval-every", "100", "--n-sens", "5", "--sens-test", "--out-dir", str(tmp_path)]
    run = language.main(language.parse_args(argv))["runs"]["lstm/seed0"]
    assert [h["step"] for h in run["history"]] == [0, 10]
    train, test = language.fake_pairs(400, 0), language.fake_pairs(100, 1)
    tok = language.Tokenizer([t for a, b, _ in train for t in (a, b)], 10000)
    x, xt = (language.encode(pairs, tok, 128)[0] for pairs in (train, test))
    assert len(measured) == 4  # at each of the two evaluations: the training pairs, then the test pairs
    assert all(torch.equal(m, want[:5]) for m, want in zip(measured, [x, xt, x, xt]))


def test_a_block_is_torchs_pre_norm_encoder_layer_with_the_same_weights():
    """Block (softmax attention, no dropout) against torch.nn.TransformerEncoderLayer with norm_first and GELU, its
    weights copied in: the same outputs on padded rows, and with causal=True under torch's causal mask. With heads x
    dim_head other than dim and an MLP wider than dim, the shapes still fit (the projections' sizes in order)."""
    torch.manual_seed(0)
    block = language.Block(12, 3, 4, 20, 0.0, "softmax", causal=False).eval()
    ref = nn.TransformerEncoderLayer(12, 3, dim_feedforward=20, dropout=0.0, activation="gelu", norm_first=True,
                                     batch_first=True).eval()
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(block.qkv.weight)  # q, k, v one after another, heads in order in each
        ref.self_attn.in_proj_bias.copy_(block.qkv.bias)
    for mine, theirs in [(block.proj, ref.self_attn.out_proj), (block.mlp[0], ref.linear1), (block.mlp[2], ref.linear2),
                         (block.ln1, ref.norm1), (block.ln2, ref.norm2)]:
        theirs.load_state_dict(mine.state_dict())
    x = torch.randn(2, 5, 12)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # the second row padded after 3 tokens
    with torch.no_grad():
        assert torch.allclose(block(x, mask), ref(x, src_key_padding_mask=~mask), atol=1e-5)
        block.causal = True
        causal = nn.Transformer.generate_square_subsequent_mask(5)
        assert torch.allclose(block(x[:1], mask[:1]), ref(x[:1], src_mask=causal, is_causal=True), atol=1e-5)
        wide = language.Block(12, 3, 5, 20, 0.0, "softmax", causal=False)  # 15 channels of heads for a width of 12
        assert wide(x, mask).shape == (2, 5, 12)
    model = language.TextTransformer(10, 8, 12, 2, heads=3, dim_head=5, mlp_dim=20, dropout=0.0)
    assert all((b.heads, b.dim_head, b.mlp[0].out_features) == (3, 5, 20) for b in model.blocks)  # in that order
