"""The C extensions, plain C on the CPython API (no numpy headers); everything else is in pyproject.toml.

- ctr_features.compiled._table_native (ctr_features/compiled/_table_native.c): the compiled table's few-row
  transform and the keys of decoded values, next to the table it runs (ctr_features/compiled/table.py);
- serving.codecs._scan_native (serving/codecs/_scan_native.c): the native scan of raw REST bodies, a
  wire-format decoder, producing the table's keys (ctr_features/compiled/raw_key.h, the key format's one
  definition in C).

Optional: without a C compiler the install still succeeds, and the server logs that it decodes raw bodies
with the exact path alone (as a checkout not installed does); tests/serving/codecs/test_unit_raw_native.py
fails there, so CI always builds them. `make fuzz` builds the same sources with ASan + UBSan into a separate
folder (build/fuzz/lib, never these in-place files) and fuzzes them (fuzz/run.py)."""

from setuptools import Extension, setup

KEY_HEADER = "ctr_features/compiled/raw_key.h"

setup(
    ext_modules=[
        Extension(
            "ctr_features.compiled._table_native",
            ["ctr_features/compiled/_table_native.c"],
            depends=[KEY_HEADER],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "serving.codecs._scan_native",
            ["serving/codecs/_scan_native.c"],
            include_dirs=["ctr_features/compiled"],
            depends=[KEY_HEADER],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
