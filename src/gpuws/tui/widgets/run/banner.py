"""A banner for one diagnosis: what happened, what it means, what to do."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from .... import protocol
from ....text.textsafe import visible

_ICON = {"error": "✗", "warning": "!", "info": "i"}


class DiagnosisBanner(Static):
    """Shows a :class:`~gpuws.protocol.Diagnosis`; its severity sets the colour.

    Counters blocked lists what was not measured (and so what fell back); no kernel
    matched lists the kernels ncu did see.
    """

    DEFAULT_CSS = """
    DiagnosisBanner { height: auto; padding: 0 1; margin: 0 0 1 0; border-left: thick $primary; }
    DiagnosisBanner.-error { border-left: thick $error; background: $error 10%; }
    DiagnosisBanner.-warning { border-left: thick $warning; background: $warning 10%; }
    DiagnosisBanner.-info { border-left: thick $primary; background: $primary 10%; }
    """

    def __init__(self, diagnosis: protocol.Diagnosis) -> None:
        super().__init__(render_diagnosis(diagnosis), classes=f"-{diagnosis.severity}")
        self.diagnosis = diagnosis


def render_diagnosis(d: protocol.Diagnosis) -> Text:
    """The banner's text."""
    text = Text()
    # Every field is the pod's word (a diagnosis is an event): visible, never an escape.
    text.append(f"{_ICON.get(d.severity, '!')} {visible(d.title, 400)}", "bold")
    text.append(f"\n{visible(d.cause)}")
    if d.meaning:
        text.append(f"\n{visible(d.meaning)}", "italic")
    for remedy in d.remedies:
        text.append("\n→ ", "bold")
        text.append(visible(remedy))
    if d.unmeasured:
        text.append("\nnot measured: ", "bold")
        text.append(visible(", ".join(d.unmeasured)))
    kernels = d.details.get("available_kernels")
    if isinstance(kernels, list) and kernels:
        text.append("\nkernels ncu saw: ", "bold")
        text.append(visible(", ".join(str(k) for k in kernels)))
    return text
