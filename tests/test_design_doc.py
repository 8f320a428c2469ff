"""``docs/design.md`` names the code a reader goes to: every file and every function, class or setting it cites
exists, so the page cannot drift from the code unnoticed."""

import re

from helpers import ROOT

DESIGN = ROOT / "docs" / "design.md"
SOURCES = [p for folder in ("project", "scripts", "tests") for p in (ROOT / folder).rglob("*.py")]
EXTERNAL = ("lightning.", "torch.", "optuna.", "python ")
CODE = re.compile(r"[A-Za-z_][\w.]*(\(.*\))?")


def cited() -> tuple[list[str], list[str]]:
    """The files and the code names the page cites in backticks."""
    files, names = [], []
    for token in re.findall(r"`([^`\n]+)`", DESIGN.read_text(encoding="utf-8")):
        if token.startswith(EXTERNAL) or " " in token.split("(")[0]:
            continue
        if "/" in token or re.search(r"\.(py|md|sh|sbatch|yaml|toml)$", token):
            if "*" not in token and "NAME" not in token:
                files.append(token.split()[0])
        elif CODE.fullmatch(token) and ("(" in token or "_" in token or "." in token or token[:1].isupper()):
            dotted = token.split("(")[0]
            if not (ROOT / (dotted.replace(".", "/") + ".py")).exists():  # project.api: a module, cited by name
                names.append(dotted.rsplit(".", 1)[-1])
    return files, names


def defined(name: str, text: str) -> bool:
    return re.search(rf"\b(def|class)\s+{re.escape(name)}\b|\b{re.escape(name)}\s*[:=]|\"{re.escape(name)}\"",
                     text) is not None


def test_every_file_the_design_page_cites_exists():
    files, _ = cited()
    assert len(files) > 20
    every = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
             if ".venv" not in p.parts and ".git" not in p.parts]
    # A file in a table row is named within the folder the row names (`model.py` in `project/recipe/`).
    missing = [f for f in files if not any(p == f.rstrip("/") or p.endswith("/" + f.rstrip("/")) for p in every)]
    assert missing == []


def test_every_code_name_the_design_page_cites_exists():
    _, names = cited()
    assert len(names) > 40
    text = "\n".join(path.read_text(encoding="utf-8") for path in SOURCES)
    missing = sorted({name for name in names if not defined(name, text)})
    assert missing == []
