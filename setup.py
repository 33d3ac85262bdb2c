"""The one C extension: the native scan of raw REST bodies (serving/codecs/_raw_native.c), plain C on the CPython
API (no numpy headers). Everything else is in pyproject.toml. Without it (a checkout not installed) the server
decodes raw bodies with msgspec alone."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("serving.codecs._raw_native", ["serving/codecs/_raw_native.c"], extra_compile_args=["-O2"])
    ]
)
