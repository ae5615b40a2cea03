"""The documented keys of ``kv_connector_extra_config`` are the keys the connector accepts.

Two tables list them: the package README's (capi/python/README.md, "Keys of
`kv_connector_extra_config`") and the docstring of ``tutti/_connector/config.py``. Both are
checked against ``KNOWN_KEYS``, the set ``from_vllm`` validates against, so a key added to
the code without a row (or a row left for a removed key) fails here, naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

from tutti._connector import config

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_keys(text: str) -> set[str]:
    """Backticked names in the first column of the table that follows the line naming
    ``kv_connector_extra_config``'s keys."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("Keys of `kv_connector_extra_config`"))
    keys: set[str] = set()
    rows = 0
    for l in lines[start + 1:]:
        if not l.strip():
            if rows:
                break
            continue
        if not l.startswith("|"):
            break
        rows += 1
        first = l.split("|")[1]
        if set(first.strip()) <= set("-: "):  # the header rule
            continue
        keys.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", first))
    keys.discard("key")
    return keys


def docstring_keys(doc: str) -> set[str]:
    """Names in ``...`` that begin a line of the reStructuredText table in the module docstring
    (the first column; a long name runs into the second, so the column is read by position
    at the start of the line, not by width)."""
    lines = doc.splitlines()
    rules = [i for i, l in enumerate(lines) if l.startswith("=====") and "  " in l.strip()]
    assert len(rules) >= 2, "config.py's docstring has no key table"
    keys: set[str] = set()
    for l in lines[rules[0] + 1:rules[-1]]:
        lead = re.match(r"(``[A-Za-z_][A-Za-z0-9_]*``,?\s*)+", l)
        if lead:
            keys.update(re.findall(r"``([A-Za-z_][A-Za-z0-9_]*)``", lead.group(0)))
    return keys


def _diff(documented: set[str], where: str) -> str:
    missing = sorted(config.KNOWN_KEYS - documented)
    extra = sorted(documented - config.KNOWN_KEYS)
    return f"{where}: keys the connector accepts but not documented {missing}; documented but not accepted {extra}"


def test_the_readme_key_table_lists_exactly_the_known_keys():
    keys = readme_keys(README.read_text())
    assert keys == config.KNOWN_KEYS, _diff(keys, str(README))


def test_config_docstring_lists_exactly_the_known_keys():
    keys = docstring_keys(config.__doc__ or "")
    assert keys == config.KNOWN_KEYS, _diff(keys, config.__file__)


def test_the_table_readers_see_a_missing_and_an_extra_row():
    """The checks above can fail: a table without one key, or with one more, reads differently."""
    text = README.read_text()
    row = next(l for l in text.splitlines() if l.startswith("| `daemon_socket` |"))
    assert readme_keys(text.replace(row + "\n", "")) == config.KNOWN_KEYS - {"daemon_socket"}
    assert readme_keys(text.replace(row, row + "\n| `no_such_key` | x |")) == config.KNOWN_KEYS | {"no_such_key"}
    doc = config.__doc__ or ""
    line = next(l for l in doc.splitlines() if l.startswith("``daemon_socket``"))
    assert "daemon_socket" not in docstring_keys(doc.replace(line, " " * len(line)))
