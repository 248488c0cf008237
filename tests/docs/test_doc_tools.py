#!/usr/bin/env python3
"""The documentation checks on small pages they are given (ctest doc_tools_rules):
scripts/check_figures.py finds a planted undated figure and accepts dated ones,
tests/docs/run_doc_commands.py runs blocks, accepts exit 77, honours skip marks and fails on
a failing command naming its line, and scripts/skip_summary.py prints one line per reason.

    usage: test_doc_tools.py SRC
"""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SRC = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else None


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, **kw)


class Figures(unittest.TestCase):
    def check(self, text):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "page.md")
            with open(path, "w") as f:
                f.write(textwrap.dedent(text))
            return run([sys.executable, os.path.join(SRC, "scripts/check_figures.py"), path])

    def test_the_shipped_pages_are_dated(self):
        p = run([sys.executable, os.path.join(SRC, "scripts/check_figures.py"),
                 os.path.join(SRC, "README.md"), os.path.join(SRC, "docs/performance.md")])
        self.assertEqual(p.returncode, 0, p.stdout)

    def test_a_planted_undated_figure_fails(self):
        for planted in ("The allreduce takes 3.2 us.", "It is 1.16x faster.", "Up 40% here.",
                        "346.9 GB/s at 1 GiB.", "The build took 2 minutes.",
                        "| allreduce | 0.98-1.29x |"):
            p = self.check(f"""\
                # Page

                ## Section (2026-11-28)

                Dated: 1.05x on 2026-11-28.

                ## Other

                {planted}
                """)
            self.assertEqual(p.returncode, 1, planted + "\n" + p.stdout)
            self.assertIn("page.md:9: undated figure", p.stdout)

    def test_dates_in_heading_item_lead_or_table_intro_count(self):
        p = self.check("""\
            # Page

            ## Measured on 2026-11-28

            Allreduce 3.2 us, 1.16x.

            ## Other

            A run on 2026-11-27 gave:

            - 2.5 us
            - 4.1 us

            One H100, 2026-11-24:

            | a | b |
            | --- | --- |
            | 1.5x | 12% |
            """)
        self.assertEqual(p.returncode, 0, p.stdout)

    def test_settings_sizes_and_machines_are_not_figures(self):
        p = self.check("""\
            # Page

            Set `MACO_DEVICE_TIMEOUT=60s`; 4x H200 and 2x H100 machines; 1 GiB messages, 4 ranks.

            ```sh
            maco-perf -b 8 -e 1G  # 3 us
            ```
            <!-- 5 us -->
            """)
        self.assertEqual(p.returncode, 0, p.stdout)

    def test_a_date_in_a_link_target_does_not_count(self):
        p = self.check("""\
            # Page

            It ran at 3.2 us ([raw](results/2026-11-28/README.md)).
            """)
        self.assertEqual(p.returncode, 1, p.stdout)


class Commands(unittest.TestCase):
    def run_page(self, text):
        d = tempfile.mkdtemp()
        src = os.path.join(d, "src")
        os.makedirs(os.path.join(src, "examples"))
        with open(os.path.join(src, "page.md"), "w") as f:
            f.write(textwrap.dedent(text))
        return run([sys.executable, os.path.join(SRC, "tests/docs/run_doc_commands.py"),
                    "--build", d, "--src", src, "--work", os.path.join(d, "work"), "page.md"])

    def test_blocks_run_in_order_and_77_counts_as_skipped(self):
        p = self.run_page("""\
            ```sh
            export V=1
            sh -c 'exit 77'
            ```

            ```bash
            [ "$V" = 1 ] && echo "got $V from the block before"
            ```
            """)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertIn("got 1 from the block before", p.stdout)
        self.assertIn("exit 77 (skipped) at page.md:3", p.stdout)

    def test_a_failing_command_fails_naming_its_line(self):
        p = self.run_page("""\
            ```sh
            true
            sh -c 'exit 3'
            echo not-reached
            ```
            """)
        self.assertEqual(p.returncode, 1, p.stdout)
        self.assertIn("FAILED: exit status 3 at page.md:3", p.stdout)
        self.assertNotIn("\nnot-reached", p.stdout)

    def test_a_marked_block_is_left_out_with_its_reason(self):
        p = self.run_page("""\
            <!-- doc-test: skip: needs a GPU -->
            ```sh
            false
            ```

            ```sh
            true
            ```
            """)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertIn("not run: page.md:2: needs a GPU", p.stdout)


class SkipSummary(unittest.TestCase):
    def test_one_line_per_reason_with_the_tests(self):
        long = "no GPU: " + "x" * 300
        xml = f"""<testsuite>
  <testcase name="a" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/>
    <system-out>[0] SKIP: rank 0 of 2: {long}\n[1] SKIP: rank 1 of 2: {long}\n</system-out></testcase>
  <testcase name="b" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/>
    <system-out>SKIP: rank 3 of 4: {long}\n</system-out></testcase>
  <testcase name="c" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/>
    <system-out>SKIP: compute-sanitizer is not installed\n</system-out></testcase>
  <testcase name="py" status="run">
    <system-out>SKIP: test_x.py::t1: PYTEST_TORCH=0\nSKIP: test_x.py::t2: PYTEST_TORCH=0\n</system-out></testcase>
</testsuite>"""
        with tempfile.NamedTemporaryFile("w", suffix=".xml", delete=False) as f:
            f.write(xml)
        p = run([sys.executable, os.path.join(SRC, "scripts/skip_summary.py"), f.name])
        os.unlink(f.name)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertEqual(p.stdout.count("x" * 300), 1, p.stdout)
        self.assertIn("2 test(s) (a, b): a rank", p.stdout)
        self.assertIn("1 test(s) (c): compute-sanitizer is not installed", p.stdout)
        self.assertEqual(p.stdout.count("PYTEST_TORCH=0"), 1, p.stdout)


if __name__ == "__main__":
    if SRC is None:
        sys.exit("usage: test_doc_tools.py SRC")
    unittest.main()
