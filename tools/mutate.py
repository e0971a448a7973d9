"""Mutation testing of the metric, loss and option code: does the test suite notice a one-line bug?

Each mutant changes one thing inside one of the functions listed in TARGETS (an arithmetic or comparison operator, a
number, a reduction such as mean <-> sum, a keyword argument dropped, a condition negated, a slice's bound dropped, None
returned, two arguments swapped, a statement or a `break` removed), in a scratch copy of the repository, and runs that
file's tests; a mutant is killed when they fail (the tests run first on the unchanged code, each test file once, and
the tool stops if one fails there: a broken or flaky test would count every mutant killed). A developer check, not part
of the test suite (it takes from minutes to an hour, one pytest run per mutant):

    python tools/mutate.py                        # every target, one process per core
    python tools/mutate.py --files robustness.py --jobs 1
    python tools/mutate.py --list                 # only print the mutants
    python tools/mutate.py --sample 300           # a random 300 of them: the kill rate with its standard error
    python tools/mutate.py --files report.py --functions summary claims   # only these functions
    python tools/mutate.py --change "drop seed=" "drop reps="   # only these kinds of change (a text they contain)
    python tools/mutate.py --rerun out/mutate/report.json   # only that report's survivors, after adding tests
    python tools/mutate.py --change "swap arguments" --skip out/mutate/*.json   # those no report ran yet

It prints each survivor (the bug the tests missed) and the share killed per file, and writes a JSON report.
Standard library only; no mutation package is needed.
"""

import argparse
import ast
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the metric, loss and option code of each file, and the tests that guard it (test_cli.py: every script's bad input)
TARGETS = {
    "common.py": (["gaussian", "replace", "flip", "predict", "not_finite", "sensitivity", "sensitivity_counts",
                   "summarise", "paired_differences", "patchify", "unpatchify", "chunk_seed",
                   "default_batch_size"],
                  ["tests/test_common.py", "tests/test_scale.py"]),
    "runs.py": (["checked", "ArgumentParser.parse_args", "per_name", "run_name", "parse", "subset_size",
                 "Results.diverged", "Results.resume",
                 # the front door, results and resume
                 "parse_with", "given", "write_json", "load_results", "new_run_dir", "set_rng_state", "restore",
                 "duration", "Results.final", "Results.finished", "ended", "Results.checkpoint", "cli", "start_run",
                 "Progress.tick", "Progress.evals_left", "Progress.seconds_left", "Progress.guessed_left",
                 "Progress.seconds", "Progress.step_time", "Progress.eval_time", "Results.progress", "time_forward",
                 # what keeps a run's results and seeds (Ctrl-C, checkpoints, torchrun, threads, data files)
                 "seed_all", "strict_json", "one_at_a_time", "corrupt_file", "rng_state", "snapshot", "Results.log",
                 "Results.save", "Results.write_checkpoint", "Results.recording", "Results.stop_progress",
                 "Progress.end_early", "for_training", "all_sum", "ranks", "process_group", "get_device", "set_threads",
                 "one_of", "torchvision_dataset", "error_line", "setup", "_terminate", "add_run_flags", "Results._run",
                 "Results.__init__", "Progress.line", "Progress.tell", "ArgumentParser.error",
                 # what a run records of its machine and code, and the rest of the front door and progress lines
                 "environment", "git_state", "cpu_model", "Run.__str__", "HelpFormatter._get_help_string",
                 "ArgumentParser.__init__", "Progress.__init__", "Progress._print_every", "Progress.stop"],
                # robustness: parse_with; test_scale: torchrun and --resume
                ["tests/test_runs.py", "tests/test_cli.py", "tests/test_robustness.py", "tests/test_scale.py"]),
    "report.py": (["identity", "crossovers", "mean_curve", "at_train_accuracy", "phases", "vision_paired",
                   "language_paired", "robustness_summary", "merge", "measured_means",
                   # what prints the claims table's numbers (report.py --claims)
                   "over_seeds", "pm", "paired_text", "own_numbers", "matched_accuracy", "end_point", "spearman",
                   "plateau", "profile_windows", "through_training", "parity_summary", "paired_lines", "summary",
                   "synthetic_claim", "fell_to", "grokking_claim", "robustness_claim", "time_split", "claims",
                   "differing_flags", "mask_sigma", "paired", "ms", "mean_se", "first_epoch", "robustness_groups",
                   "flag_key", "seeds", "models", "parse_args", "main",
                   # what the figures draw of the numbers (the curves, their bands and error bars, the profiles)
                   "plot_curves", "legend", "draw_training", "draw_data_scale", "draw_language", "draw",
                   "draw_synthetic", "draw_vision", "draw_robustness", "draw_grokking", "draw_parity", "pyplot",
                   "save_figure"],
                  ["tests/test_figures.py", "tests/test_runs.py", "tests/test_vision.py", "tests/test_language.py",
                   "tests/test_grokking.py", "tests/test_robustness.py", "tests/test_parity.py",
                   "tests/test_synthetic.py", "tests/test_imagenet.py", "tests/test_cli.py"]),  # test_cli: parse_args
    "vision.py": (["normalize", "augment_batch", "evaluate", "measure_sensitivity", "scattered_copies",
                   "scattered_sensitivity", "lr_at", "learning_rate", "train", "make_optimizer",
                   "prepare_data", "check_flags", "load_dataset", "add_flags", "parse_args",
                   # the models and what the training loop measures with
                   "MLP.__init__", "MLP.forward", "PatchNorm.__init__", "PatchNorm.forward", "build_model", "ablation",
                   "measure_during", "logged", "cross_entropy", "final_sweep", "final_record", "main"],
                  ["tests/test_vision.py", "tests/test_scale.py", "tests/test_cli.py"]),  # test_scale: torchrun
    "vits.py": (["FeedForward.__init__", "FeedForward.forward", "dropout_rows", "Attention.__init__",
                 "Attention.forward", "Transformer.__init__", "Transformer.forward",
                 "ShiftedPatchTokenization.__init__", "ShiftedPatchTokenization.forward", "ViT.__init__", "ViT.embed",
                 "ViT.forward", "SimpleViT.__init__", "SimpleViT.forward", "sincos_2d"],
                ["tests/test_vision.py", "tests/test_scale.py", "tests/test_cli.py"]),
    "imagenet.py": (["load_images", "measure", "main", "load_model", "parse_args"],
                    ["tests/test_imagenet.py", "tests/test_cli.py"]),
    "convnets.py": (["BasicBlock.__init__", "BasicBlock.forward", "ResNet18.__init__", "ResNet18.forward",
                     "DenseLayer.__init__", "DenseLayer.forward", "DenseNet121.__init__", "DenseNet121.forward",
                     "ConvMixer.__init__", "ConvMixer.forward", "CNN.__init__", "CNN.forward"],
                    ["tests/test_convnets.py", "tests/test_vision.py"]),
    "synthetic.py": (["make_data", "make_sets", "vote", "vote_classifier", "evaluate", "AttentionClassifier.attention",
                      "AttentionClassifier.forward", "AttentionClassifier.head_in_token_space", "Vocab.__init__",
                      "train_one", "main", "Vocab.sparse", "Vocab.frequent", "settings",
                      "AttentionClassifier.__init__", "check_sizes", "parse_args", "Vocab.to"],
                     ["tests/test_synthetic.py", "tests/test_scale.py", "tests/test_cli.py"]),  # test_scale: --resume
    "language.py": (["Tokenizer.encode_pair", "encode", "evaluate", "measure_sensitivity", "Block.forward",
                     "Block.attend", "by_length", "Block.forward_suffix", "TextTransformer.prefix_cache",
                     "TextTransformer.forward_from", "LSTMClassifier.prefix_cache", "LSTMClassifier.forward_from",
                     "per_pair", "train_one",
                     # the models
                     "Block.__init__", "Block.qkv_heads", "TextTransformer.__init__", "TextTransformer.embed_normed",
                     "TextTransformer.forward_normed", "TextTransformer.forward", "LSTMLayer.__init__", "LSTMLayer.run",
                     "LSTMClassifier.__init__", "LSTMClassifier.embed_normed", "LSTMClassifier.run_fused",
                     "LSTMClassifier.forward_normed", "LSTMClassifier.forward", "build_model", "trim", "main",
                     "LSTMLayer.forward", "TextTransformer.read_out", "sensitivities", "label", "Tokenizer.encode",
                     "words", "fake_pairs", "Tokenizer.__init__", "Tokenizer.decode", "parse_args"],
                    ["tests/test_language.py", "tests/test_scale.py", "tests/test_cli.py"]),  # test_scale: --resume
    "glue.py": (["split_files", "download", "read_tsv"], ["tests/test_language.py", "tests/test_cli.py"]),
    "robustness.py": (["random_patch_noise", "make_loss", "sharpness", "accuracy", "evaluate_corruptions",
                       "Normalize.__init__", "Normalize.forward", "evaluate_model", "main", "default_corruptions",
                       "parse_args"],
                      ["tests/test_robustness.py", "tests/test_scale.py", "tests/test_cli.py"]),  # test_scale: --resume
    "corruptions.py": (["truncate", "gaussian_kernel", "gaussian_filter", "defocus_blur", "motion", "clipped_zoom",
                        "zoom_blur", "through_pil", "pixelate", "sample", "elastic_transform", "glass_blur", "snow",
                        "canny", "edge_distance", "box3", "equalize", "water", "spatter", "frost", "corrupt",
                        "grey", "colour", "gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "pad",
                        "filter2d", "gaussian_blur", "motion_blur", "plasma_fractal", "fog", "value", "brightness",
                        "contrast", "saturate", "jpeg_compression", "neighbours", "check_corruption", "load_frost",
                        "read_release", "check_release"],
                       ["tests/test_corruptions.py", "tests/test_robustness.py"]),
    "grokking.py": (["make_data", "loss_fn", "evaluate", "measure_sensitivity", "train_one",
                     "OneLayerTransformer.__init__", "OneLayerTransformer.embed",
                     "OneLayerTransformer.forward_embedded", "OneLayerTransformer.forward", "main", "grokked_for",
                     "parse_args"],
                    ["tests/test_grokking.py", "tests/test_scale.py", "tests/test_cli.py"]),  # test_scale: --resume
    "parity.py": (["make_task", "parity", "walsh_hadamard", "exact_sensitivity", "evaluate", "measure_sensitivity",
                   "train_one", "Block.__init__", "Block.forward", "ParityTransformer.__init__",
                   "ParityTransformer.embed", "ParityTransformer.forward", "main", "setting", "all_inputs",
                   "parse_args"],
                  ["tests/test_parity.py", "tests/test_scale.py", "tests/test_cli.py"]),  # test_scale: --resume
    # the baselines that bench.py's speed-ups divide by, and how it times them (the figures its issues quote)
    "bench.py": (["timed_rounds", "median", "naive_sensitivity", "bench_estimator", "epoch_on_device",
                  "bench_training", "reserve", "main", "mrpc_like", "bench_language", "bench_scattered",
                  "bench_read_token", "bench_read_token_training", "vit_every_token", "bench_sens_during",
                  "bench_paper_vit", "training_workload", "busy_worker", "bench_shared_cpu", "bench_quickstart",
                  "bench_corruptions", "rss_mb", "bench_memory", "run_all", "parse_args", "TinyViT.__init__",
                  "TinyViT.forward", "TinyMLP.__init__", "TinyMLP.forward", "UInt8Images.__init__",
                  "UInt8Images.__len__", "UInt8Images.__getitem__"],
                 ["tests/test_bench.py", "tests/test_cli.py"]),  # test_cli: parse_args
    # what says that a refactor changed no number
    "tools/same_numbers.py": (["compare", "run_all", "main"],
                              ["tests/test_reproduce.py::test_same_numbers_compares_every_value_and_names_what_changed",
                               "tests/test_reproduce.py::test_same_numbers_runs_each_small_run_in_one_thread_on_its_"
                               "data_and_reads_what_it_wrote",
                               "tests/test_reproduce.py::test_same_numbers_says_for_each_run_whether_its_numbers_are_"
                               "the_same",
                               "tests/test_reproduce.py::test_same_numbers_runs_a_revision_and_the_working_tree_and_"
                               "says_which_runs_changed"]),
    # what says whether a rerun's numbers moved beyond their standard errors (its tests alone: not the smoke run)
    "tools/claims_cpu.py": (["blocks", "numbers", "stored", "rows_of", "compare", "main"],
                            [f"tests/test_reproduce.py::test_{name}" for name in [
                                "every_number_of_the_readme_table_is_in_the_claims_of_its_rows",
                                "claims_compare_counts_how_far_each_number_moved_in_standard_errors",
                                "claims_against_reads_the_claims_an_older_commit_stored",
                                "claims_against_without_compare_or_an_unknown_revision_is_one_line",
                                "claims_compare_prints_each_row_and_writes_nothing",
                                "claims_tool_on_a_folder_report_py_refuses_says_why_in_one_line",
                                "claims_tool_help_shows_its_examples_and_every_flag"]]),
    # what a sampled patch mask would do to the vision rows (RESULTS: why --sens-positions is not used)
    "tools/sampled_positions.py": (["stored_run", "remeasure", "main"],
                                   ["tests/test_vision.py::test_the_sampled_positions_tool_"
                                    "gives_what_a_run_sampling_those_positions_stores"]),
    # how close the generated corruptions are to the release's generator (its side needs the release's libraries)
    "tools/cifar_c_fidelity.py": (["ours", "draws_of", "replaying", "replayed", "sharpness", "same_order", "table",
                                   "compare", "fixture", "main"], ["tests/test_corruptions.py"]),
    # the mutation check itself: what it changes, which mutants it runs, how it runs them and what it reports
    "tools/mutate.py": (["setting", "mutations", "find", "mutants", "label", "run", "named", "among", "parse_args",
                         "main"], ["tests/test_mutate.py"]),
}
BINOPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
          ast.Pow: ast.Mult, ast.Mod: ast.FloorDiv}
COMPARE = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
METHODS = {"mean": "sum", "sum": "mean", "max": "min", "min": "max", "argmax": "argmin", "amax": "amin",
           "amin": "amax", "std": "var", "sqrt": "abs", "softmax": "log_softmax", "relu": "abs"}

# calls, by their last name, in which the order of two arguments does not matter (max(a, b); transpose(1, 2))
SYMMETRIC = {"max", "min", "maximum", "minimum", "hypot", "equal", "transpose", "swapaxes"}


def setting(node, field, new):
    """An apply() that sets node.field to new() and returns the undo, which puts the old value back."""
    def apply():
        saved = getattr(node, field)
        setattr(node, field, new())
        return lambda: setattr(node, field, saved)
    return apply


def mutations(func):
    """(node, description, apply) for every one-node change of a function's AST; apply() edits it in place and
    returns an undo."""
    out = []
    for node in ast.walk(func):
        if isinstance(node, ast.BinOp) and type(node.op) in BINOPS:
            new = BINOPS[type(node.op)]
            out.append((node, f"{type(node.op).__name__} -> {new.__name__}", setting(node, "op", new)))
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in COMPARE:
                    def flip(n=node, i=i, o=op):
                        n.ops[i] = COMPARE[type(o)]()
                        return lambda: n.ops.__setitem__(i, o)
                    out.append((node, f"{type(op).__name__} -> {COMPARE[type(op)].__name__}", flip))
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            out.append((node, f"{type(node.op).__name__} -> {new.__name__}", setting(node, "op", new)))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
            old = node.value
            new = (old + 1 if old != 1 else 0) if isinstance(old, int) else (old * 2 if old else 1.0)
            out.append((node, f"{old!r} -> {new!r}", setting(node, "value", lambda w=new: w)))
        elif isinstance(node, ast.Attribute) and node.attr in METHODS:
            new = METHODS[node.attr]
            out.append((node, f".{node.attr} -> .{new}", setting(node, "attr", lambda w=new: w)))
        elif isinstance(node, ast.Call):
            for i, kw in enumerate(node.keywords):
                if kw.arg not in (None, "device"):  # device=: equivalent on the CPU where the tests run
                    def drop(n=node, i=i, k=kw):
                        n.keywords.pop(i)
                        return lambda: n.keywords.insert(i, k)
                    out.append((node, f"drop {kw.arg}=", drop))
            args = node.args  # f(a, b) -> f(b, a): two neighbours swapped, where the order can matter
            for i in range(len(args) - 1 if ast.unparse(node.func).split(".")[-1] not in SYMMETRIC else 0):
                if ast.dump(args[i]) != ast.dump(args[i + 1]) and \
                        not any(isinstance(a, ast.Starred) for a in args[i:i + 2]):
                    def swap(a=args, i=i):
                        a[i], a[i + 1] = a[i + 1], a[i]
                        return lambda: a.__setitem__(slice(i, i + 2), [a[i + 1], a[i]])
                    out.append((node, f"swap arguments {i + 1} and {i + 2}", swap))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)) and not isinstance(node.test, (ast.Compare, ast.UnaryOp)):
            # `if x:` -> `if not x:` (a comparison is flipped above, a `not` dropped below)
            out.append((node, "negate the condition",
                        setting(node, "test", lambda n=node: ast.UnaryOp(ast.Not(), n.test))))
        elif isinstance(node, ast.Slice):  # x[a:b:c] -> x[:b:c], x[a::c], x[a:b]
            for part in ["lower", "upper", "step"]:
                if getattr(node, part) is not None:
                    out.append((node, f"drop a slice's {part} bound", setting(node, part, lambda: None)))
        elif isinstance(node, ast.Return) and node.value is not None and \
                not (isinstance(node.value, ast.Constant) and node.value.value is None):
            out.append((node, "return None", setting(node, "value", lambda: ast.Constant(None))))  # `return x`
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            out.append((node, f"drop {type(node.op).__name__}", setting(node, "op", ast.UAdd)))
        for field in ["body", "orelse"]:  # statements that do something without a name depending on them
            stmts = getattr(node, field, None)  # (the function's own body too: a `model.eval()` or `n += 1` there)
            if isinstance(stmts, list):
                for i, s in enumerate(stmts):
                    if isinstance(s, (ast.Expr, ast.AugAssign, ast.Break, ast.Continue)) and \
                            not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):  # a docstring
                        def delete(st=stmts, i=i, s=s):
                            st[i] = ast.Pass()
                            return lambda: st.__setitem__(i, s)
                        out.append((s, f"delete `{ast.unparse(s)[:50]}`", delete))
    return out


def find(tree, name):
    """The FunctionDef `name` or `Class.name` of a module."""
    scope = tree.body
    *outer, last = name.split(".")
    for part in outer:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == part).body
    return next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == last)


def mutants(path, names):
    """Every mutant of the listed functions of one file: (function, line, description, occurrence, mutated source),
    occurrence counting the mutants of that function, line and description (a line with two 1s has two '1 -> 0')."""
    source = open(os.path.join(ROOT, path)).read()
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    for name in names:
        func = find(tree, name)
        start = min([func.lineno] + [d.lineno for d in func.decorator_list]) - 1
        indent = " " * func.col_offset
        seen = Counter()
        for node, what, apply in mutations(func):
            undo = apply()
            body = "".join(indent + line + "\n" for line in ast.unparse(func).splitlines())
            undo()
            line = getattr(node, "lineno", func.lineno)
            seen[line, what] += 1
            yield name, line, what, seen[line, what], "".join(lines[:start]) + body + "".join(lines[func.end_lineno:])


def label(path, function, line, what, k):
    """A mutant as the lists print it: where, what, and which of the same changes on its line when not the first."""
    return f"{path}:{line} {function}: {what}" + (f" (#{k} on the line)" if k > 1 else "")


def run(copy, path, source, tests, timeout):
    """Whether the tests fail (the mutant is killed) with `source` in place of `path` in the scratch copy."""
    target = os.path.join(copy, path)
    original = open(target).read()
    with open(target, "w") as fh:
        fh.write(source)
    try:
        for marks in ["not slow", "slow"]:  # the quick tests first; the end-to-end runs only for a survivor
            # in a process group of its own, so that a timeout also stops the scripts the tests started
            done = subprocess.Popen([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", marks,
                                     *tests], cwd=copy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
            try:
                code = done.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None  # an infinite loop is a failure the user would notice
            finally:  # what is left of the group: a test run timed out or stopped by Ctrl-C, a script it left behind
                try:
                    os.killpg(done.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                done.wait()
            if code not in (0, 5):  # 5: no test selected
                return True
        return False
    finally:
        with open(target, "w") as fh:
            fh.write(original)


def named(report, survivors=False):
    """The mutants a JSON report ran (its survivors alone with survivors=True), each named by file, function, line,
    change and occurrence (None in a report written before occurrences were recorded: every occurrence then)."""
    return {(r["file"], r["function"], r["line"], r["mutation"], r.get("occurrence"))
            for r in json.load(open(report))["mutants"] if not (survivors and r["killed"])}


def among(mutant, names):
    """Whether a listed mutant is one of `named`'s: by its occurrence, or by every occurrence (None)."""
    return mutant[:5] in names or (*mutant[:4], None) in names


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", nargs="+", default=list(TARGETS), choices=list(TARGETS), help="files to mutate")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants run side by side")
    p.add_argument("--timeout", type=int, default=300, help="seconds before a mutant's test run counts as failed")
    p.add_argument("--functions", nargs="+", default=None, help="only these functions of the files (as in TARGETS)")
    p.add_argument("--change", nargs="+", default=None, help="only the mutants whose change contains one of these "
                   "texts, as --list prints it ('drop positions=', 'drop', 'Lt -> ')")
    p.add_argument("--list", action="store_true", help="only list the mutants (those --sample and --rerun select)")
    p.add_argument("--sample", type=int, default=0, help="run only this many mutants drawn at random (0: all)")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the --sample draw")
    p.add_argument("--rerun", type=str, default=None, help="run only the mutants that survived in this JSON report")
    p.add_argument("--skip", nargs="+", default=[], metavar="REPORT", help="leave out every mutant these JSON reports "
                   "ran, killed or not: the rest of a kind, in pieces (a Ctrl-C still writes the report of its piece)")
    p.add_argument("--out", type=str, default="out/mutate/report.json", help="the JSON report")
    args = p.parse_args(argv)
    args.names = {path: [n for n in TARGETS[path][0] if args.functions is None or n in args.functions]
                  for path in args.files}  # the functions to mutate, per file
    for flag, value, least in [("--jobs", args.jobs, 1), ("--timeout", args.timeout, 1), ("--sample", args.sample, 0)]:
        if value < least:  # (--jobs 0 would start no run and wait for ever; --sample -3 would run every mutant)
            p.error(f"{flag} must be at least {least}, got {value}")
    unknown = set(args.functions or []) - {n for ns in args.names.values() for n in ns}
    if unknown:
        p.error(f"--functions {' '.join(sorted(unknown))}: not a target of {' '.join(args.files)} (TARGETS lists them)")
    for flag, report in [("--rerun", args.rerun)] * bool(args.rerun) + [("--skip", r) for r in args.skip]:
        try:  # read now: a missing, damaged or foreign report is one line, not a traceback after the first check
            named(report, survivors=flag == "--rerun")
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = e.strerror if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
            p.error(f"{flag} {report}: not a report that mutate.py wrote ({why})")
    return args


def main(args):
    todo = [(path, *m, TARGETS[path][1]) for path in args.files for m in mutants(path, args.names[path])]
    todo = [t for t in todo if args.change is None or any(c in t[3] for c in args.change)]
    if args.rerun:  # the survivors of an earlier report
        survived = named(args.rerun, survivors=True)
        todo = [t for t in todo if among(t, survived)]
    ran = set().union(*(named(report) for report in args.skip))
    todo = [t for t in todo if not among(t, ran)]
    if 0 < args.sample < len(todo):  # a uniform draw, kept in file order
        todo = [todo[i] for i in sorted(random.Random(args.sample_seed).sample(range(len(todo)), args.sample))]
    if args.list:
        for path, name, line, what, k, _, _ in todo:
            print(label(path, name, line, what, k))
        print(f"{len(todo)} mutants")
        return
    copies, free = [], queue.Queue()  # free: the copies no test run is using
    for _ in range(args.jobs):  # one scratch copy of the repository per worker
        copy = tempfile.mkdtemp(prefix="mutate-")
        shutil.copytree(ROOT, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", "out", ".venv",
                                                                                       "__pycache__", "*.pt"))
        copies.append(copy)
        free.put(copy)

    def in_a_copy(path, source, tests):  # each run takes a copy that no other run is using, and gives it back
        copy = free.get()
        try:
            return run(copy, path, source, tests, args.timeout)
        finally:
            free.put(copy)

    t0, done = time.time(), {}  # done: each mutant's result by its index, as its run ends
    # the tests on the unchanged code first, each test file once: if one fails (a broken test, or a flaky one), every
    # mutant of the files it guards would count as killed
    files = list(dict.fromkeys(path for path, *_ in todo))
    # per test file (dicts as ordered sets): what the files' lists name of it (the file, or tests of it), and the files
    # whose mutants it runs
    listed, guarded = {}, {}
    for path in files:
        for name in TARGETS[path][1]:
            test_file = name.split("::")[0]
            listed.setdefault(test_file, {})[name] = None
            guarded.setdefault(test_file, {})[path] = None

    def clean(test_file):  # beside the first file it guards, unchanged
        path = next(iter(guarded[test_file]))
        tests = [test_file] if test_file in listed[test_file] else list(listed[test_file])
        return in_a_copy(path, open(os.path.join(ROOT, path)).read(), tests)

    def work(i):
        path, name, line, what, k, source, tests = todo[i]
        killed = in_a_copy(path, source, tests)
        print(f"[{i + 1}/{len(todo)} {time.time() - t0:.0f}s] {'killed  ' if killed else 'SURVIVED'} "
              f"{label(path, name, line, what, k)}", flush=True)
        done[i] = {"file": path, "function": name, "line": line, "mutation": what, "occurrence": k, "killed": killed}

    pool = ThreadPoolExecutor(args.jobs)
    try:
        failing = [f for f, failed in zip(listed, pool.map(clean, listed)) if failed]
        if failing:
            their = dict.fromkeys(path for f in failing for path in guarded[f])
            sys.exit(f"tools/mutate.py: the tests in {', '.join(failing)} fail on the unchanged code (broken, flaky, "
                     f"or past --timeout): every mutant of {', '.join(their)} would count as killed; make them pass "
                     "first")
        if files:
            print(f"the tests of {len(files)} file(s) pass on the unchanged code, each of their {len(listed)} test "
                  f"files run once ({time.time() - t0:.0f}s)", flush=True)
        list(pool.map(work, range(len(todo))))  # (raising what a run raised)
    except KeyboardInterrupt:  # Ctrl-C: the report holds every mutant whose run ended
        pass
    finally:
        pool.shutdown(cancel_futures=True)  # the runs under way end; those not started never start
        for copy in copies:
            shutil.rmtree(copy, ignore_errors=True)
    results = [done[i] for i in sorted(done)]
    if len(results) < len(todo):
        print(f"\ninterrupted after {len(results)} of {len(todo)} mutants")
    print("\nsurvivors (the tests missed these):")
    for r in results:
        if not r["killed"]:
            print("  " + label(r["file"], r["function"], r["line"], r["mutation"], r["occurrence"]))
    summary = {}
    for path in args.files:
        rs = [r for r in results if r["file"] == path]
        if not rs:  # a file none of whose functions was asked for (--functions, --rerun)
            continue
        summary[path] = {"mutants": len(rs), "killed": sum(r["killed"] for r in rs)}
        print(f"{path}: {summary[path]['killed']}/{len(rs)} killed ({summary[path]['killed'] / len(rs):.0%})")
    total = sum(s["killed"] for s in summary.values()), sum(s["mutants"] for s in summary.values())
    share = total[0] / max(total[1], 1)
    error = (share * (1 - share) / max(total[1], 1)) ** 0.5  # of a random sample's kill rate (binomial)
    print(f"all: {total[0]}/{total[1]} killed ({share:.1%} +- {error:.1%}) in {time.time() - t0:.0f}s")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"summary": summary, "mutants": results}, fh, indent=1)


if __name__ == "__main__":
    # a kill or a `timeout`'s SIGTERM ends it as a Ctrl-C does: the runs under way end (their process groups with
    # them), the copies are removed, and the report holds every mutant whose run ended
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main(parse_args())
