"""Small files with one job: no hand-written source file over 400 lines and no function over
80 lines (bench/ and the generated tandem/v1 excepted). The failure lists every offender."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPS = ("tandem", "services", "controller", "tests", "deploy")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def hand_written_sources() -> list[pathlib.Path]:
    files = [p for top in TOPS for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(p for p in files if p.relative_to(ROOT).parts[:2] != ("tandem", "v1"))


def offenders(path: pathlib.Path) -> list[str]:
    text = path.read_text()
    rel = path.relative_to(ROOT).as_posix()
    out = []
    lines = text.count("\n") + (not text.endswith("\n") and bool(text))
    if lines > MAX_FILE_LINES:
        out.append(f"{rel}: {lines} lines (max {MAX_FILE_LINES})")
    for node in ast.walk(ast.parse(text, rel)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{rel}:{node.lineno} {node.name}: {length} lines (max {MAX_FUNCTION_LINES})")
    return out


def test_no_long_files_or_functions():
    files = hand_written_sources()
    assert len(files) > 100 and not any("tandem/v1/" in p.as_posix() for p in files)
    found = [o for p in files for o in offenders(p)]
    assert not found, "split these:\n" + "\n".join(found)


def test_the_check_sees_a_long_function(tmp_path):
    """Control: a file with an 81-line function and 401 lines is reported twice."""
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    src = tmp_path / "long.py"
    src.write_text(f"def f():\n{body}\n" + "\n" * (400 - 81) + "y = 1\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = offenders(src)
    finally:
        ROOT = saved
    assert len(found) == 2 and "f: 81 lines" in found[1] and "401 lines" in found[0], found
