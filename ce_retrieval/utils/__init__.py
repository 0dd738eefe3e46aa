"""Small shared utilities of the library's own modules (``atomic``: atomic file and directory writes;
``dataclass_yaml``: dataclasses <-> YAML with strict overrides, under the configs; ``seeding``: the one seeding
point every entry calls before it builds a layer).

They are implementation details, so nothing is re-exported here; library code imports the submodule
(``from ce_retrieval.utils.atomic import atomic_write_text``).
"""

__all__: list[str] = []
