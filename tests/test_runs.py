"""The run plumbing in runs.py: the results file, run folders, strict JSON, the divergence rule, the exit codes of
cli(), --resume through the parser, and report.py's redraw and merge of run folders."""

import json
import os

import pytest

from runs import Results, cli, load_results, new_run_dir, write_json


def test_results_file_shape_and_atomic_rewrite(tmp_path):
    res = Results(str(tmp_path), "vision", {"lr": 0.1}, "cpu")
    res.log("vit/seed0", {"epoch": 0, "sens": 0.5})
    res.final("vit/seed0", {"sens": 0.4, "sens_stderr": 0.01})
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data["args"] == {"lr": 0.1} and data["env"]["device"] == "cpu" and data["script"] == "vision"
    run = data["runs"]["vit/seed0"]
    assert run == {"history": [{"epoch": 0, "sens": 0.5}], "final": {"sens": 0.4, "sens_stderr": 0.01}}
    assert os.listdir(tmp_path) == ["metrics.json"]  # no temp file left behind
    assert load_results(str(tmp_path))["runs"].keys() == {"vit/seed0"}


def test_corrupt_or_missing_results_file_is_a_clear_error(tmp_path):
    (tmp_path / "metrics.json").write_text('{"args": {}, "ru')
    with pytest.raises(ValueError, match="not a valid metrics.json"):
        load_results(str(tmp_path))
    with pytest.raises(ValueError, match="no results file"):
        load_results(str(tmp_path / "nothing.json"))
    write_json(str(tmp_path / "x.json"), [1])
    with pytest.raises(ValueError, match="not a metrics.json"):
        load_results(str(tmp_path / "x.json"))


def test_run_dir_is_never_reused(tmp_path):
    a = new_run_dir("vision", "vit", out_dir=str(tmp_path))
    b = new_run_dir("vision", "vit", out_dir=str(tmp_path))
    assert a != b and b.endswith("vit-2") and os.path.isdir(a) and os.path.isdir(b)


def test_strict_json_and_no_replace(tmp_path):
    """NaN and inf become null; the file is readable by strict parsers; replace=False never replaces a file."""
    path = tmp_path / "m.json"
    write_json(str(path), {"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(c)) == {"a": None, "b": [1.5, None],
                                                                                     "c": {"d": None}}
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(FileExistsError):
        write_json(str(path), {"x": 1}, replace=False)
    assert json.loads(path.read_text())["b"] == [1.5, None] and os.listdir(tmp_path) == ["m.json"]


def test_divergence_rule(tmp_path, capsys):
    """Non-finite, or over 100x the run's first loss (at least 1), is diverged: marked in metrics.json with its step,
    a non-finite loss written as null; a finite loss below the limit is not."""
    res = Results(str(tmp_path), "vision", {}, "cpu")
    assert not res.diverged("a", 0, 0.7) and not res.diverged("a", 1, 99.0)
    assert res.diverged("a", 2, 101.0)
    assert not res.diverged("b", 0, 3.0) and not res.diverged("b", 5, 299.0) and res.diverged("b", 6, 301.0)
    assert res.diverged("c", 0, float("nan"))
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data["runs"]["a"]["diverged"] == {"step": 2, "loss": 101.0}
    assert data["runs"]["c"]["diverged"] == {"step": 0, "loss": None}
    err = capsys.readouterr().err
    assert "c diverged at step 0 (training loss nan: not finite)" in err and "over 100x the initial 0.7" in err


def test_cli_exit_codes(tmp_path, capsys):
    """cli(): a normal run returns; ValueError / FileNotFoundError -> 2, a diverged run -> 3, Ctrl-C -> 130, each
    with one line on stderr and metrics.json marked interrupted."""
    def main_of(body):
        def main(args):
            return body()
        main.__module__ = __name__
        return main

    parse = lambda argv: None  # noqa: E731
    assert cli(main_of(lambda: {"runs": {"x": {}}}), parse, []) is None
    res = Results(str(tmp_path), "vision", {}, "cpu")

    def interrupted():
        with res.recording():
            raise KeyboardInterrupt

    for body, code, text in [(lambda: (_ for _ in ()).throw(ValueError("--n-sens 9 asks for more")), 2, "--n-sens"),
                             (lambda: open(tmp_path / "none.txt"), 2, "No such file or directory"),
                             (lambda: {"runs": {"vit/seed0": {"diverged": {"step": 3}}}}, 3, "vit/seed0"),
                             (interrupted, 130, "interrupted")]:
        with pytest.raises(SystemExit) as e:
            cli(main_of(body), parse, [])
        err = capsys.readouterr().err
        assert e.value.code == code and text in err and len(err.strip().splitlines()) == 1, err
    assert json.loads((tmp_path / "metrics.json").read_text())["interrupted"] is True
