"""delegate.native: the one build-and-load mechanism of the plugins' C helpers."""

from delegate import native


def test_libraries_loaded_one_after_another_stay_distinct(tmp_path):
    """Each library is its own, even when loaded right after another (the loader knows a library by its
    path; a reused descriptor number would hand back the first one)."""
    compiler = native.find_compiler()
    assert compiler is not None, "the tests need a C compiler (the README's system packages)"
    loaded = []
    for name, value in (("first", 1), ("second", 2), ("third", 3)):
        source = tmp_path / f"{name}.c"
        source.write_text(f"int {name}_value(void) {{ return {value}; }}\n")
        loaded.append((name, value, native.open_library(native.compile_library(compiler, ["-O1"], source))))
    for name, value, library in loaded:
        assert getattr(library, f"{name}_value")() == value
