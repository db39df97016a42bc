"""Progress bars: tqdm's on a terminal, one plain line per update in a log."""

from __future__ import annotations

import io

from deepmetric.progress import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_each_update_is_its_own_line_and_rare():
    log = io.StringIO()
    bar = progress_bar(total=300, desc="training", unit="step", file=log)
    for _ in range(300):
        bar.update(1)
    bar.set_postfix(loss="0.0812")
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert 1 <= len(lines) <= 3 and lines[-1].startswith("training: 300/300 [") and "loss=0.0812" in lines[-1]


def test_on_a_terminal_it_is_tqdm_s_bar():
    screen = Terminal()
    bar = progress_bar(range(50), desc="embedding", file=screen, mininterval=0)
    for _ in bar:
        pass
    assert "\r" in screen.getvalue() and "|" in screen.getvalue()  # redraws in place, with the bar graphic
