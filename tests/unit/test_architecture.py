"""The product's shape: imports run one way down the layers, no product module imports the development
tools, the engine imports no Django, and no product source file grows past ~400 lines.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and are checked with import-linter, the
layers contract Kraken Technologies uses on its Django monolith.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400
PRODUCT_PACKAGES = (
    "chatsite",
    "api",
    "operations",
    "conversations",
    "safety",
    "memory",
    "accounts",
    "billing",
    "organizations",
    "inference",
    "events",
    "observability",
    "database",
    "documents",
)
#: Product files allowed past MAX_LINES, each with its reason.
LONG_FILE_EXCEPTIONS: dict[str, str] = {}


def test_import_contracts_are_kept():
    """``lint-imports`` exits 0: no upward import between layers, no product module importing
    ``devtools``, no Django in ``inference.engine``. Its report names each offending import."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_product_package_is_in_the_layers_contract():
    """A new top-level package must be placed in the layers (or added to the tools' side) on purpose."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    roots = set(config["root_packages"])
    assert set(PRODUCT_PACKAGES) | {"devtools"} == roots
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages <= roots, f"packages outside the import contracts: {sorted(packages - roots)}"


def test_product_source_files_stay_under_the_line_limit():
    """No product source file over MAX_LINES lines (migrations and the listed exceptions aside)."""
    too_long = {}
    for package in PRODUCT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel or rel in LONG_FILE_EXCEPTIONS:
                continue
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                too_long[rel] = lines
    assert not too_long, f"split these by concern: {too_long}"


def test_the_pages_own_scripts_stay_under_the_line_limit():
    """No script of the product's own under ``static/`` (the vendored libraries aside) over MAX_LINES lines:
    the chat page is split by concern (docs/chat-page.md)."""
    scripts = [
        p for p in (ROOT / "static").rglob("*.js") if "vendor" not in p.relative_to(ROOT / "static").parts
    ]
    assert any(p.name == "chat.js" for p in scripts)
    too_long = {
        p.relative_to(ROOT).as_posix(): n
        for p in scripts
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"split these by concern: {too_long}"
