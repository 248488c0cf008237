#!/usr/bin/env python3
"""The shape checker (scripts/check_shape.py) on small trees made here: a clean tree passes,
a function body one line over the limit, a #define inside a function (and inside a C++
member function), a library file over 700 lines, a file of python-bindings/ over 700 lines, a
library constructor, a machine name or a date in code each fail with their message, and braces
of namespaces, classes, structs and extern "C" blocks are not taken for functions (so the
`shape` test can fail).

  usage: tests/shape/test_check_shape.py [SOURCE_DIR]   (SOURCE_DIR: where scripts/ is)
"""
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
CHECKER = os.path.join(ROOT, "scripts", "check_shape.py")


def body(n, indent=""):
    """A function body of exactly n lines from its `{` to its `}` (n >= 2)."""
    inner = [f"{indent}    x += {random.randint(1, 9)};" for _ in range(n - 2)]
    return [indent + "{"] + inner + [indent + "}"]


class Shape(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="maco-shape-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write(self, rel, lines):
        path = os.path.join(self.dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")

    def run_checker(self):
        r = subprocess.run([sys.executable, CHECKER, self.dir], capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr

    def test_clean_tree_passes_at_the_limit(self):
        self.write("src/a.c", ["#define FILE_SCOPE 1", "static int f(int x)"] + body(150) +
                   ["", "int g(void)"] + body(3))
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)
        self.assertIn("0 problem(s)", out)

    def test_one_line_over_fails(self):
        self.write("algorithms/k.cu", ["__global__ void __launch_bounds__(256)",
                                       "    my_kernel(int x)"] + body(151))
        rc, out = self.run_checker()
        self.assertEqual(rc, 1, out)
        self.assertIn("algorithms/k.cu:3: my_kernel: a body of 151 lines (at most 150)", out)

    def test_define_inside_a_body_fails(self):
        b = body(10)
        b.insert(3, "#define CAPTURES(q) (x + (q))")
        self.write("proxy/p.c", ["/* a comment (with parentheses) */", "void load(void)"] + b)
        rc, out = self.run_checker()
        self.assertEqual(rc, 1, out)
        self.assertIn("proxy/p.c:6: load: #define inside a function body", out)

    def test_member_function_counts(self):
        self.write("python-bindings/src/m.cpp",
                   ["namespace", "{", "class K", "{", "  public:", "    int big(int x)"] +
                   body(160, "    ") + ["};", "} // namespace"])
        rc, out = self.run_checker()
        self.assertEqual(rc, 1, out)
        self.assertIn("m.cpp:7: big: a body of 160 lines", out)
        self.assertNotIn(": K:", out)

    def test_namespaces_classes_and_blocks_are_not_functions(self):
        self.write("nccl/n.cpp", ["extern \"C\"", "{"] + ["int v%d;" % i for i in range(200)] +
                   ["}", "struct S", "{"] + ["    int m%d;" % i for i in range(200)] + ["};"])
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)

    def test_long_file_in_python_bindings_fails(self):
        self.write("python-bindings/maco/big.py", ["x = %d" % i for i in range(701)])
        self.write("python-bindings/maco/at_limit.py", ["x = %d" % i for i in range(700)])
        self.write("python-bindings/src/big.h", ["int v%d;" % i for i in range(702)])
        self.write("python-bindings/README.md", ["text"] * 900)  # not a source or build file
        self.write("python-bindings/maco/__pycache__/big.py", ["x = 1"] * 900)
        self.write("tests/long.c", ["int v%d;" % i for i in range(900)])  # the rule's folders only
        rc, out = self.run_checker()
        self.assertEqual(rc, 1, out)
        self.assertIn("python-bindings/maco/big.py: 701 lines (at most 700 in python-bindings/: "
                      "split it by topic)", out)
        self.assertIn("python-bindings/src/big.h: 702 lines", out)
        for name in ("at_limit.py", "README.md", "__pycache__", "long.c"):
            self.assertNotIn(name, out)
        self.assertIn("2 problem(s)", out)

    def test_tests_are_not_checked(self):
        self.write("tests/t.cc", ["void long_test(void)"] + body(400))
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)


    def test_library_file_one_line_over_fails(self):
        lines = ["int f(void)"] + body(3)
        self.write("runtime/host/long.c", lines + ["/* filler */"] * (700 - len(lines)))
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)
        self.write("runtime/host/long.c", lines + ["/* filler */"] * (701 - len(lines)))
        rc, out = self.run_checker()
        self.assertEqual(rc, 1, out)
        self.assertIn("runtime/host/long.c: 701 lines (a library file has at most 700", out)

    def test_tools_may_be_longer(self):
        self.write("tools/maco-x.c", ["/* filler */"] * 900)
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)

    def test_library_constructor_fails(self):
        self.write("algorithms/common/setup.c",
                   ["__attribute__((constructor)) static void attach(void)"] + body(3))
        rc, out = self.run_checker()
        self.assertEqual(rc, 1, out)
        self.assertIn("algorithms/common/setup.c:1: a library constructor", out)

    def test_machine_names_and_dates_fail(self):
        for text, word in (("/* 12 us on an H200 */", "H200"), ("/* two gh200s */", "gh200s"),
                           ("/* measured 2026-11-27 */", "2026-11"),
                           ('const char *s = "on 4x A100";', "A100")):
            self.write("proxy/p.c", [text])
            rc, out = self.run_checker()
            self.assertEqual(rc, 1, out)
            self.assertIn(f"proxy/p.c:1: '{word}': machine names and dates belong in", out)
        self.write("proxy/p.c", ["/* sm_90a, 0x2026, maco__h100_free is not a machine */"])
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)

    def test_exceptions_are_listed_and_kept_true(self):
        # nccl/env.c's constructor is a listed exception; once it has none, the entry is stale.
        self.write("nccl/env.c", ["__attribute__((constructor)) static void at_load(void)"] +
                   body(3))
        rc, out = self.run_checker()
        self.assertEqual(rc, 0, out)
        self.write("nccl/env.c", ["static void at_load(void)"] + body(3))
        rc, out = self.run_checker()
        self.assertEqual(rc, 1, out)
        self.assertIn("nccl/env.c: listed as an exception to 'registration'", out)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
