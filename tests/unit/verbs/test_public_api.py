"""The verbs API is one module: the README's snippet imports everything it uses from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import rocev2_emu.verbs

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_snippet_imports_every_name_it_uses_from_rocev2_emu_verbs() -> None:
    (snippet,) = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    tree = ast.parse(snippet.replace("async with", "with").replace("await ", ""))
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
    assert [i.module for i in imports] == ["rocev2_emu.verbs"]
    imported = {a.name for a in imports[0].names}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id[0].isupper()}
    assert used <= imported, f"used but not imported: {used - imported}"
    missing = imported - set(rocev2_emu.verbs.__all__)
    assert not missing, f"not exported by rocev2_emu.verbs: {missing}"
