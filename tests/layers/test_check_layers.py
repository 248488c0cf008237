#!/usr/bin/env python3
"""The layers checker (scripts/check_layers.py, with scripts/check_py_layers.py for the Python
package) on small trees made here: a clean tree passes, and each kind of violation fails with
its message (so the `layers` test can fail).

  usage: tests/layers/test_check_layers.py [SOURCE_DIR]   (SOURCE_DIR: where scripts/ is)
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
CHECKER = os.path.join(ROOT, "scripts", "check_layers.py")

TABLE = """# design

<!-- layers: read by scripts/check_layers.py -->
| layer | paths | includes | what it holds |
| --- | --- | --- | --- |
| clients | `nccl/` `tools/` | public | clients |
| tests | `tests/` | any | tests |
| runtime, beside algorithms | `runtime/` | below | persistent kernels |
| algorithms | `algorithms/` | below | collectives |
| proxy | `proxy/` | below | proxy |
| comm | `src/host/comm/` | below | communicator |
| comm-base | `src/host/comm/comm_base.c` | below | a leaf |
| base | `src/host/base/` | below | base |
| public | `include/maco/` | public | public API |

Text after the table.
"""

CLEAN = {
    "include/maco/status.h": "#include <stdint.h>\n",
    "include/maco/comm.h": '#include "maco/status.h"\n',
    "src/host/base/log.h": '#include "maco/status.h"\n',
    "src/host/base/log.c": '#include "src/host/base/log.h"\n',
    "src/host/comm/comm_base.c": '#include "src/host/base/log.h"\n',
    "src/host/comm/comm.c": '#include "src/host/base/log.h"\n#include "maco/comm.h"\n',
    "proxy/transport.h": '#include "src/host/base/log.h"\n',
    "proxy/transport.c": '#include "proxy/transport.h"\n#include "proxy/transport/tcp/tcp.h"\n',
    "proxy/proxy.c": '#include "proxy/transport.h"\n',
    "proxy/transport/tcp/tcp.h": '#include "proxy/transport.h"\n',
    "proxy/transport/tcp/tcp.c": '#include "proxy/transport/tcp/tcp.h"\n',
    "proxy/transport/ib/ib.c": '#include "proxy/transport.h"\n#include <infiniband/verbs.h>\n',
    "algorithms/common/state.h": '#include "proxy/transport.h"\n#include "src/host/comm/x.h"\n',
    "src/host/comm/x.h": "/* #include \"algorithms/common/state.h\" (a comment, not counted) */\n",
    "algorithms/p2p/p2p.c": '#include "algorithms/common/state.h"\n#include <cuda_runtime.h>\n',
    "runtime/host/graph.c": '#include "proxy/transport.h"\n#include "maco/comm.h"\n',
    "nccl/shim.h": '#include "maco/comm.h"\n#include <nccl.h>\n',
    "nccl/comm.c": '#include "shim.h"\n',
    "tools/run.c": '#include <maco/comm.h>\n#include "maco_build_info.h"\n',
    "tests/test_unit.cc": '#include "src/host/comm/x.h"\n#include "maco_test.h"\n',
    "tests/maco_test.h": '#include "maco/status.h"\n',
}


class CheckLayers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="maco-layers-")
        self.write("docs/design.md", TABLE)
        for path, text in CLEAN.items():
            self.write(path, text)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, path, text):
        full = os.path.join(self.dir, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as fh:
            fh.write(text)

    def append(self, path, text):
        with open(os.path.join(self.dir, path), "a") as fh:
            fh.write(text)

    def check(self):
        res = subprocess.run([sys.executable, CHECKER, "--sources", self.dir],
                             capture_output=True, text=True, timeout=60)
        return res.returncode, res.stdout + res.stderr

    def fails_with(self, *needles):
        rc, out = self.check()
        self.assertEqual(rc, 1, out)
        for n in needles:
            self.assertIn(n, out)
        return out

    def test_clean_tree_passes(self):
        rc, out = self.check()
        self.assertEqual(rc, 0, out)
        self.assertIn(f"9 layers, {len(CLEAN)} source files, 0 problem(s)", out)

    def test_bare_name_in_the_library(self):
        self.append("src/host/base/log.c", '#include "log.h"\n')
        self.fails_with("src/host/base/log.c (base): #include \"log.h\" names "
                        "src/host/base/log.h by a relative path")

    def test_bare_name_of_another_folder_in_the_library(self):
        self.append("algorithms/p2p/p2p.c", '#include "log.h"\n')
        self.fails_with("algorithms/p2p/p2p.c (algorithms): #include \"log.h\" names a file of "
                        "another folder by a bare name (src/host/base/log.h)")

    def test_include_of_a_layer_above(self):
        layer = random.choice(["src/host/base/log.c", "src/host/comm/comm_base.c", "proxy/proxy.c"])
        self.append(layer, '#include "algorithms/common/state.h"\n')
        self.fails_with(f"{layer} (", "reaches layer algorithms, above")

    def test_include_of_a_layer_beside(self):
        self.append("runtime/host/graph.c", '#include "algorithms/common/state.h"\n')
        self.fails_with("runtime/host/graph.c (runtime): #include \"algorithms/common/state.h\" "
                        "reaches layer algorithms, beside runtime")
        self.write("runtime/host/graph.c", "")
        self.append("algorithms/p2p/p2p.c", '#include "runtime/host/graph.c"\n')
        self.fails_with("reaches layer runtime, beside algorithms")

    def test_beside_a_row_that_is_not_there(self):
        self.write("docs/design.md", TABLE.replace("runtime, beside algorithms",
                                                   "runtime, beside nowhere"))
        self.fails_with("docs/design.md: layer runtime is beside 'nowhere', which is no row")

    def test_longest_path_wins(self):
        # comm_base.c is in comm-base, below comm: it may not include comm's header.
        self.append("src/host/comm/comm_base.c", '#include "src/host/comm/x.h"\n')
        self.fails_with("src/host/comm/comm_base.c (comm-base): #include \"src/host/comm/x.h\" "
                        "reaches layer comm, above comm-base")

    def test_library_never_includes_clients_or_tests(self):
        self.append("algorithms/p2p/p2p.c", '#include "tests/maco_test.h"\n')
        self.fails_with("reaches layer tests, which the library never includes")

    def test_client_reaches_an_internal_header(self):
        self.append("nccl/comm.c", '#include "../src/host/base/log.h"\n')
        self.fails_with("nccl/comm.c (clients): #include \"../src/host/base/log.h\" reaches "
                        "src/host/base/log.h")

    def test_client_names_a_public_header_by_path(self):
        self.append("tools/run.c", '#include "../include/maco/comm.h"\n')
        self.fails_with("public headers are named maco/...")

    def test_transports_include_each_other(self):
        self.append("proxy/transport/ib/ib.c", '#include "proxy/transport/tcp/tcp.h"\n')
        self.fails_with("proxy/transport/ib/ib.c: #include \"proxy/transport/tcp/tcp.h\": a "
                        "transport's files are its own")

    def test_proxy_core_names_a_transport(self):
        self.append("proxy/proxy.c", '#include "proxy/transport/tcp/tcp.h"\n')
        self.fails_with("proxy/proxy.c: #include \"proxy/transport/tcp/tcp.h\"")

    def test_file_in_no_layer(self):
        self.write("newfolder/x.c", "int x;\n")
        self.fails_with("newfolder/x.c: in no layer of docs/design.md's table")

    def test_table_names_a_missing_path(self):
        self.write("docs/design.md", TABLE.replace("`src/host/base/`", "`src/host/base/` `gone/`"))
        self.fails_with("docs/design.md: layer base names gone/, which is not in the tree")

    def test_table_with_an_unknown_includes_kind(self):
        self.write("docs/design.md", TABLE.replace("| proxy | `proxy/` | below |",
                                                   "| proxy | `proxy/` | sideways |"))
        self.fails_with("docs/design.md: layer proxy: includes 'sideways' is none of")

    def test_no_table(self):
        self.write("docs/design.md", "# design\n\nNo table.\n")
        self.fails_with("docs/design.md: no layer table")

    def test_include_loop(self):
        self.append("src/host/base/log.h", '#include "src/host/base/other.h"\n')
        self.write("src/host/base/other.h", '#include "src/host/base/log.h"\n')
        self.fails_with("include loop: src/host/base/log.h <-> src/host/base/other.h")


    # ------------------------------------------------------------ objects (needs a C compiler)

    def build(self, sources):
        """Compiles {path: C text} into a build folder laid out as CMake's (maco_core.dir for the
        library, <client>/CMakeFiles/x.dir for clients) with its compile_commands.json."""
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            self.skipTest("no C compiler")
        build = os.path.join(self.dir, "build")
        cmds = []
        for path, text in sources.items():
            self.write(path, text)
            top = path.split("/", 1)[0]
            lib = top in ("src", "proxy", "algorithms", "runtime")
            out = (f"CMakeFiles/maco_core.dir/{path}.o" if lib
                   else f"{top}/CMakeFiles/client.dir/{os.path.basename(path)}.o")
            os.makedirs(os.path.dirname(os.path.join(build, out)), exist_ok=True)
            src = os.path.join(self.dir, path)
            subprocess.run([cc, "-c", src, "-o", os.path.join(build, out)], check=True)
            cmds.append({"directory": build, "file": src, "output": out,
                         "command": f"{cc} -c {src} -o {out}"})
        with open(os.path.join(build, "compile_commands.json"), "w") as fh:
            json.dump(cmds, fh)
        return build

    def check_build(self, build):
        res = subprocess.run([sys.executable, CHECKER, build, self.dir], capture_output=True,
                             text=True, timeout=60)
        return res.returncode, res.stdout + res.stderr

    def test_objects_clean(self):
        build = self.build({
            "src/host/base/log.c": "void maco__log(void) {}\n",
            "src/host/comm/comm.c": "void maco__log(void); void maco_comm(void) { maco__log(); }\n",
            "proxy/transport.c": "void maco__tcp(void); void maco__tp(void) { maco__tcp(); }\n",
            "proxy/transport/tcp/tcp.c": "void maco__log(void); void maco__tcp(void) { maco__log(); }\n",
            "nccl/comm.c": "void maco_comm(void); void f(void) { maco_comm(); }\n"})
        rc, out = self.check_build(build)
        self.assertEqual(rc, 0, out)
        self.assertIn("4 library objects with 3 call edges, 1 client objects, 0 problem(s)", out)

    def test_objects_call_a_layer_above_and_loop(self):
        build = self.build({
            "src/host/base/log.c": "void maco_comm(void); void maco__log(void) { maco_comm(); }\n",
            "src/host/comm/comm.c": "void maco__log(void); void maco_comm(void) { maco__log(); }\n"})
        rc, out = self.check_build(build)
        self.assertEqual(rc, 1, out)
        self.assertIn("call loop between files: src/host/base/log.c <-> src/host/comm/comm.c", out)
        self.assertIn("layer violation: src/host/base/log.c (base) calls src/host/comm/comm.c "
                      "(comm, a layer above it): maco_comm", out)

    def test_objects_call_a_layer_beside(self):
        build = self.build({
            "algorithms/p2p/p2p.c": "void maco__p2p(void) {}\n",
            "runtime/host/graph.c": "void maco__p2p(void); void maco__graph(void) { maco__p2p(); }\n"})
        rc, out = self.check_build(build)
        self.assertEqual(rc, 1, out)
        self.assertIn("layer violation: runtime/host/graph.c (runtime) calls algorithms/p2p/p2p.c "
                      "(algorithms, a layer beside it): maco__p2p", out)

    def test_objects_weak_hook_is_no_call(self):
        # The communicator names the collectives' hook weakly: no edge up, no loop.
        build = self.build({
            "src/host/comm/comm_base.c":
                "int maco__hook(void) __attribute__((weak));\n"
                "int maco__base(void) { return maco__hook ? maco__hook() : 0; }\n",
            "algorithms/p2p/p2p.c":
                "int maco__base(void); int maco__hook(void) { return maco__base(); }\n"})
        rc, out = self.check_build(build)
        self.assertEqual(rc, 0, out)
        self.assertIn("2 library objects with 1 call edges", out)

    def test_objects_client_files_call_in_a_loop(self):
        build = self.build({
            "src/host/base/log.c": "void maco_log(void) {}\n",
            "nccl/comm.c": "void maco_nccl__b(void); void maco_nccl__a(void) { maco_nccl__b(); }\n",
            "nccl/fallback.c":
                "void maco_nccl__a(void); void maco_nccl__b(void) { maco_nccl__a(); }\n",
            "tools/run.c": "void maco_nccl__a(void); int main(void) { maco_nccl__a(); }\n"})
        rc, out = self.check_build(build)
        self.assertEqual(rc, 1, out)
        self.assertIn("call loop between files of nccl/: nccl/comm.c <-> nccl/fallback.c", out)
        self.assertNotIn("tools/run.c <->", out)

    def test_objects_transports_call_each_other(self):
        build = self.build({
            "proxy/transport/tcp/tcp.c": "void maco__ib(void); void maco__tcp(void) { maco__ib(); }\n",
            "proxy/transport/ib/ib.c": "void maco__ib(void) {}\n",
            "proxy/proxy.c": "void maco__ib(void); void maco__proxy(void) { maco__ib(); }\n"})
        out = self.check_build(build)[1]
        self.assertIn("transport rule: proxy/transport/tcp/tcp.c calls proxy/transport/ib/ib.c", out)
        self.assertIn("transport rule: proxy/proxy.c calls proxy/transport/ib/ib.c", out)

    def test_objects_client_uses_an_internal_symbol(self):
        build = self.build({
            "src/host/base/log.c": "void maco__log(void) {}\n",
            "nccl/comm.c": "void maco__log(void); void f(void) { maco__log(); }\n"})
        rc, out = self.check_build(build)
        self.assertEqual(rc, 1, out)
        self.assertIn("nccl/comm.c: a client of the public API uses internal symbols: maco__log", out)


# The Python package's stack (scripts/check_py_layers.py, run by check_layers.py).
PY_TABLE = """
<!-- python layers: read by scripts/check_py_layers.py -->
| layer | modules | what it holds |
| --- | --- | --- |
| package | `__init__.py` | the public names |
| integrations | `torch.py` `tp.py` | need torch / import it where used |
| overlap | `_overlap.py` `_collectives.py` | the middle |
| dsl | `language.py` | beside: the extension only when verifying |
| base | `_comm.py` `_maco.pyi` | the bottom |
"""

PY_CLEAN = {
    "__init__.py": ("from . import _comm, tp\nfrom ._collectives import allreduce\n\n\n"
                    "def __getattr__(name):\n    from . import torch  # needs torch\n"
                    "    return getattr(torch, name)\n"),
    "torch.py": "import torch\nimport torch.distributed as dist\nfrom ._comm import C\n",
    "tp.py": ("from . import _comm\n\n\ndef f():\n    import torch\n\n"
              "    return lambda: torch\n"),
    "_overlap.py": ("import sys\nfrom ._comm import C\n\n\nclass S:\n    def m(self):\n"
                    "        import numpy as np\n        from torch.overrides import TorchFunctionMode\n"
                    "        return np, TorchFunctionMode\n"),
    "_collectives.py": "from . import _comm\nfrom ._overlap import S\n\nallreduce = S\n",
    "language.py": ("import json\n\n\ndef verify():\n    from maco import _maco\n\n"
                    "    return _maco\n"),
    "_comm.py": "import json\nfrom . import _maco\n\nC = json\n",
    "_maco.pyi": "def version() -> str: ...\n",
}


class CheckPythonLayers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="maco-pylayers-")
        self.write("docs/design.md", TABLE + PY_TABLE)
        for path, text in CLEAN.items():
            self.write(path, text)
        for name, text in PY_CLEAN.items():
            self.write("python-bindings/maco/" + name, text)

    tearDown = CheckLayers.tearDown
    write = CheckLayers.write
    check = CheckLayers.check
    fails_with = CheckLayers.fails_with

    def py(self, name, text):
        with open(os.path.join(self.dir, "python-bindings/maco", name), "a") as fh:
            fh.write(text)

    def test_clean_package_passes(self):
        rc, out = self.check()
        self.assertEqual(rc, 0, out)
        self.assertIn(f"5 Python layers with {len(PY_CLEAN)} modules, 0 problem(s)", out)

    def test_import_from_a_layer_above_and_the_loop_it_makes(self):
        self.py("_comm.py", "from ._overlap import S\n")
        self.fails_with("python-bindings/maco/_comm.py:5 (base): imports _overlap of layer "
                        "overlap, above it",
                        "Python import loop: python-bindings/maco/_comm.py -> "
                        "python-bindings/maco/_overlap.py")

    def test_loop_within_a_layer(self):
        self.py("_collectives.py", "")
        self.py("_overlap.py", "from . import _collectives\n")
        self.fails_with("Python import loop: python-bindings/maco/_collectives.py -> "
                        "python-bindings/maco/_overlap.py")

    def test_import_inside_a_function_of_what_is_not_optional(self):
        self.py("tp.py", "\n\ndef g():\n    import json\n    return json\n")
        self.fails_with("python-bindings/maco/tp.py:11: import of json inside a function: "
                        "only optional packages (torch, cupy, numpy, ml_dtypes)")

    def test_module_imported_inside_a_function_to_dodge_a_loop(self):
        self.py("_collectives.py", "\n\ndef g():\n    from . import _comm\n    return _comm\n")
        self.fails_with("python-bindings/maco/_collectives.py:8: import of _comm inside a "
                        "function: it needs no optional package")

    def test_lazy_import_of_a_torch_module_from_below(self):
        self.py("_overlap.py", "\n\ndef route():\n    from . import torch as mt\n    return mt\n")
        self.fails_with("python-bindings/maco/_overlap.py:13 (overlap): imports torch of layer "
                        "integrations, above it")

    def test_extension_inside_a_function_of_a_module_that_loads_the_package(self):
        self.py("_collectives.py", "\n\ndef g():\n    from . import _maco\n    return _maco\n")
        self.fails_with("python-bindings/maco/_collectives.py:8: import of _maco inside a "
                        "function")

    def test_module_in_no_layer_and_missing_module(self):
        self.write("python-bindings/maco/_new.py", "")
        self.write("docs/design.md", TABLE + PY_TABLE.replace("`tp.py`", "`tp.py` `_gone.py`"))
        self.fails_with("python-bindings/maco/_new.py: in no layer of docs/design.md's Python "
                        "table",
                        "docs/design.md: Python layer integrations names "
                        "python-bindings/maco/_gone.py, which is not in the tree")

    def test_no_python_table(self):
        self.write("docs/design.md", TABLE)
        self.fails_with("docs/design.md: no Python layer table")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=1)
