"""The one C extension: the raw path's native parts (serving/codecs/_raw_native.c: the body scan, the few-row
transform and the keys), plain C on the CPython API (no numpy headers). Everything else is in pyproject.toml.
Optional: without a C compiler the install still succeeds, and the server logs that it decodes raw bodies with
msgspec alone (as a checkout not installed does); tests/serving/unit/test_unit_raw_native.py fails there, so CI
always builds it."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "serving.codecs._raw_native",
            ["serving/codecs/_raw_native.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
