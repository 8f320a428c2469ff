"""A YAML file read strictly, for ``--config`` files and sweep spaces: one line for anything that is not a mapping
the project wrote or could have (a duplicate key, an alias bomb, a file that is not UTF-8 text). Loaded (with
PyYAML) only by what reads one."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from project.config.validators import shown
from project.errors import UsageError, first_line, not_a_regular_file


def load_yaml(path: str, label: str, expected: str = "a mapping of flag names to values") -> dict[str, Any]:
    """A YAML file that must hold a mapping; any problem is one line starting with ``label``."""
    import yaml

    problem = not_a_regular_file(Path(path))
    if problem:
        raise UsageError(f"{label}: {problem}")
    try:
        with open(path, encoding="utf-8") as stream:
            document = yaml.load(stream, Loader=_unique_keys_loader()) or {}  # a SafeLoader
    except DuplicateKey as err:
        raise UsageError(f"{label}: {shown(err.key)} is given twice (line {err.line}); keep one") from None
    except OSError as err:
        raise UsageError(f"{label}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{label}: not UTF-8 text (save it as UTF-8)") from None
    except yaml.YAMLError as err:
        raise UsageError(f"{label}: not valid YAML ({first_line(err)})") from None
    except RecursionError:
        raise UsageError(f"{label}: nested too deeply to be a config file") from None
    if not isinstance(document, dict):
        raise UsageError(f"{label}: expected {expected}")
    if _expanded_size(document, MAX_VALUES) > MAX_VALUES:
        raise UsageError(f"{label}: expands to more than {MAX_VALUES:,} values (YAML aliases); write the values out")
    return document


MAX_VALUES = 10_000  # far more than any config or search space holds; an alias bomb expands to billions


class DuplicateKey(Exception):
    """A mapping in a YAML file that gives one key twice: YAML's loaders keep the last silently."""

    def __init__(self, key: Any, line: int) -> None:
        super().__init__(key)
        self.key, self.line = key, line


@functools.cache
def _unique_keys_loader() -> Any:
    """PyYAML's ``SafeLoader``, refusing a key given twice in one mapping."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:  # the mapping's own keys: a merged one (<<) may be overridden
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeys


def _expanded_size(value: Any, limit: int) -> int:
    """How many values ``value`` holds once its aliases are expanded, counting no further than past ``limit``."""
    count, stack = 0, [value]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            stack += list(item)
    return count
