"""The GLUE files of language.py's tasks (MRPC, QQP): where they come from, how a split is laid out, and reading
them with errors that say what is wrong and where to put the files.

    python language.py --download --data-dir GLUE --task mrpc    # fetches them through download() below
"""

import csv
import os
import urllib.request
import zipfile

# the official GLUE files (the URLs of GLUE's download script) and how each task's TSV columns are laid out
URLS = {
    "mrpc": {"msr_paraphrase_train.txt": "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_train.txt",
             "msr_paraphrase_test.txt": "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_test.txt",
             "dev_ids.tsv": "https://dl.fbaipublicfiles.com/glue/data/mrpc_dev_ids.tsv"},
    "qqp": {"QQP-clean.zip": "https://dl.fbaipublicfiles.com/glue/data/QQP-clean.zip"},
}
COLUMNS = {"mrpc": ("#1 String", "#2 String", "Quality"), "qqp": ("question1", "question2", "is_duplicate")}
# the (train, test) files of each split under --data-dir/<TASK>/; GLUE's test labels are hidden, so its validation
# set is the test set
SPLITS = {"mrpc": {"paper": ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt"), "glue": ("train.tsv", "dev.tsv")},
          "qqp": {"glue": ("train.tsv", "dev.tsv")}}


def split_files(task):
    """The files each split of the task reads, for the lines that say what to put where."""
    return "; ".join(f"--split {split}: {', '.join(names)}" for split, names in SPLITS[task].items())


def download(task, data_dir):
    """Fetch the official GLUE files for the task into data_dir/<TASK>/ and build train.tsv and dev.tsv."""
    folder = os.path.join(data_dir, task.upper())
    os.makedirs(folder, exist_ok=True)
    for name, url in URLS[task].items():  # the files GLUE's own download script fetches
        try:
            urllib.request.urlretrieve(url, os.path.join(folder, name))
        except OSError as e:
            raise FileNotFoundError(f"cannot download {url} ({e}). Without a network, put the {task.upper()} files "
                                    f"({split_files(task)}) in {os.path.abspath(folder)}") from None
    if task == "qqp":
        try:
            with zipfile.ZipFile(os.path.join(folder, "QQP-clean.zip")) as z:
                for name in ["train.tsv", "dev.tsv"]:
                    with z.open(f"QQP/{name}") as src, open(os.path.join(folder, name), "wb") as dst:
                        dst.write(src.read())
        except (zipfile.BadZipFile, KeyError) as e:
            raise ValueError(f"{os.path.join(folder, 'QQP-clean.zip')} is not GLUE's QQP archive ({e})") from None
        return
    # MRPC, GLUE's rule: dev = the training pairs listed in dev_ids.tsv, train = the other training pairs
    with open(os.path.join(folder, "dev_ids.tsv"), encoding="utf-8") as fh:
        dev_ids = {tuple(row) for row in csv.reader(fh, delimiter="\t")}  # (id1, id2) of the 408 validation pairs
    path = os.path.join(folder, "msr_paraphrase_train.txt")
    with open(path, encoding="utf-8-sig") as fh:
        header, *rows = fh.read().splitlines()
    with open(os.path.join(folder, "train.tsv"), "w", encoding="utf-8") as tr, \
            open(os.path.join(folder, "dev.tsv"), "w", encoding="utf-8") as dv:
        tr.write(header + "\n")
        dv.write(header + "\n")
        for i, row in enumerate(rows, start=2):
            fields = row.split("\t")
            if len(fields) != 5:
                raise ValueError(f"{path} line {i} has {len(fields)} tab-separated fields, expected 5")
            label, id1, id2, s1, s2 = fields
            (dv if (id1, id2) in dev_ids else tr).write(f"{label}\t{id1}\t{id2}\t{s1}\t{s2}\n")


def read_tsv(path, task):
    """[(sentence A, sentence B, label)] of a GLUE TSV file. A missing file is a FileNotFoundError that says where
    to put it; a present but malformed one (a missing column, a short row, a label outside {0, 1}) a ValueError
    naming the file and the line."""
    a, b, y = COLUMNS[task]
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)  # GLUE's sentences hold bare quotes
            missing = [c for c in (a, b, y) if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"{path} is not a GLUE {task.upper()} file: no column {missing[0]!r} in its header")
            pairs = []
            for row in reader:
                line = reader.line_num
                if None in row.values() or None in row:  # fewer fields than the header (None values), or more
                    n = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None, []))
                    raise ValueError(f"{path} line {line} has {n} fields, not the header's {len(reader.fieldnames)} "
                                     "(a truncated or malformed file)")
                if row[y] not in ("0", "1"):
                    raise ValueError(f"{path} line {line}: label {row[y]!r} is not 0 or 1")
                pairs.append((row[a], row[b], int(row[y])))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found. Put the {task.upper()} files ({split_files(task)}) in "
                                f"{os.path.dirname(os.path.abspath(path))}, or run with --download where there is a "
                                "network") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e})") from None
    if not pairs:
        raise ValueError(f"{path} holds no sentence pairs")
    with open(path, "rb") as fh:  # GLUE's files end with a newline: a last row without one was cut off
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) != b"\n":
            raise ValueError(f"{path} ends inside its last row (line {line}): a truncated file? Replace it with a "
                             "complete copy")
    return pairs
