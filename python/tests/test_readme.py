"""The README's Python snippet (its section "From Python"), taken from
README.md and run as written: on the host backend (a Python host kernel)
and, where the package was built with CUDA headers, on the cuda backend
against the mock driver (the kernel from CUDA C++ through NVRTC)."""
import pathlib
import re

import pytest

import ruda

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MOCK = pathlib.Path(ruda.__file__).with_name("_test_mockcuda.so")


def snippet():
    text = README.read_text()
    section = text[text.index("## From Python"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the README's Python section has one Python snippet"
    return blocks[0]


def test_the_snippet_is_a_script():
    code = snippet()
    assert "await" not in code.replace("await dev.read(...)", ""), "a top-level await does not run"
    compile(code, "README.md", "exec")


def test_readme_snippet_runs_on_the_host_backend(monkeypatch):
    monkeypatch.setenv("RUDA_BACKEND", "host")
    exec(compile(snippet(), "README.md", "exec"), {"__name__": "readme"})


def test_readme_snippet_runs_on_the_cuda_backend_mock(monkeypatch, tmp_path):
    if not MOCK.exists():
        pytest.skip("built without CUDA headers: no mock driver")
    monkeypatch.setenv("RUDA_BACKEND", "cuda")
    monkeypatch.setenv("RUDA_CUDA_DRIVER", str(MOCK))
    monkeypatch.setenv("RUDA_CACHE_DIR", str(tmp_path))
    try:
        exec(compile(snippet(), "README.md", "exec"), {"__name__": "readme"})
    except (ruda.ENONVRTC, ruda.ENOBACKEND, ruda.ENODRIVER) as e:
        pytest.skip(f"no NVRTC or cuda backend: {e}")
