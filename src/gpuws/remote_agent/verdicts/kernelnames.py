"""One kernel, many spellings: matching the names torch.profiler, nsys and ncu give it.

Tier 2 names a kernel the way its tool demangles it, and Tier 3 filters ncu by name, so a
kernel chosen by one tool has to be found under another tool's spelling. Seen on an H200
(tests/fixtures/kernel-names-h200): torch.profiler writes
``void at::native::elementwise_kernel<128, 4, …>(int, …)``, ncu's demangled base writes
``void at::native::elementwise_kernel<(int)128, (int)4, …>(int, T3)``, its mangled base
``_ZN2at6native18elementwise_kernelILi128ELi4E…``, its function base
``elementwise_kernel``; ``(anonymous namespace)`` is ncu's ``<unnamed>`` and
``{lambda(int)#1}`` its ``[lambda(int) (instance 1)]``.

:func:`canonical` maps the demangled spellings to one key (no return type, no parameter
list, no literal casts or suffixes, one spacing). A mangled name cannot be demangled with
the standard library in general, so it is matched by what its Itanium encoding spells
plainly: the source names (``<length><identifier>``) and the integer literals
(``Li128E``), against the demangled name's identifiers and numbers
(:func:`same_kernel`'s ``template`` grade). :func:`ncu_regex` writes a ``-k regex:`` body
that matches every demangled spelling of one kernel and, with enough of its template
arguments, none of its siblings.

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import functools
import re
from typing import Dict, Iterable, List, Optional, Set, Tuple

#: The grades of :func:`same_kernel`, best first.
EXACT, TEMPLATE, BASE = "exact", "template", "base"
GRADES = (EXACT, TEMPLATE, BASE)
#: Longest ``-k regex:`` body :func:`ncu_regex` writes: long enough for the template
#: arguments that tell torch's elementwise instances apart, short of any regex engine's
#: limits.
MAX_REGEX = 2500

_ANON = "{anon}"
#: Spellings of the anonymous namespace: c++filt/torch, ncu, some tools, the mangling.
_ANON_SPELLINGS = re.compile(
    r"\(anonymous namespace\)|<unnamed>|\banonymous_namespace\b|\b_GLOBAL__N_\d+\b")
#: ncu's ``[lambda(int) (instance 1)]`` (and ``[unnamed type (instance 1)]``) written as
#: c++filt writes it: ``{lambda(int)#1}``.
_INSTANCE = re.compile(r"\[([^\[\]]*?) \(instance (\d+)\)\]")
#: A cast on a template literal: ``(int)128``, ``(unsigned long)1``, ``(c10::ScalarType)5``.
_CAST = re.compile(r"\((?:[A-Za-z_][\w:]*)(?: [A-Za-z_][\w:]*)*\)(?=-?\d)")
#: An integer literal's suffix: ``1ul``, ``4u``, ``2LL``.
_FUNCTION_ARG = re.compile(r"&\((?:[\w:<>*& ]+ )?([A-Za-z_][\w:]*(?:<[^()]*>)?)\([^()]*\)\)")
_SUFFIX = re.compile(r"(?<![\w.])(-?\d+)(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)(?!\w)")
_BOOL = {"true": "1", "false": "0"}
_WORD = re.compile(r"[A-Za-z_]\w*|\d+")
_TOKEN = re.compile(r"\{anon\}|#\d+|[A-Za-z_]\w*|\d+|[()]")
#: Words that say nothing of which kernel it is, and that tools write or leave out at will.
_KEYWORDS = frozenset({"void", "const", "volatile"})
#: Words that are C++ spelling, not a kernel's identity (the mangling writes them as
#: letters or abbreviations: ``v``, ``i``, ``St``, ``Sa``).
_NOT_IDENTIFIERS = frozenset({
    "void", "int", "unsigned", "signed", "long", "short", "char", "bool", "float", "double",
    "const", "volatile", "wchar_t", "char8_t", "char16_t", "char32_t", "__int128", "auto",
    "decltype", "struct", "class", "enum", "union", "typename", "operator", "true", "false",
    "anon", "lambda", "instance", "unnamed", "type", "anonymous", "namespace", "std",
    "allocator", "basic_string", "char_traits", "basic_istream", "basic_ostream",
    "basic_iostream", "restrict", "__restrict", "__restrict__", "nullptr", "sizeof",
})
_TEMPLATE_PARAM = re.compile(r"^T\d*$")
_IDENT_END = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
#: Builtin type codes of an Itanium literal (``L<type><value>E``).
_LITERAL = re.compile(r"L([abcdhijlmnostxy])(n?)(\d+)E")
_SUBSTITUTION = re.compile(r"S[0-9A-Z]*_|S[tabsiod]")
_TEMPLATE_REF = re.compile(r"T\d*_|fp\d*_|fL\d+p\d*_")
_CLOSURE_END = re.compile(r"E\d*_")
_UNNAMED_TYPE = re.compile(r"Ut\d*_")
_ENUM_LITERAL = re.compile(r"L(\d+)([A-Za-z_]\w*?n?\d+E)")
#: Builtin types as the mangling writes them, and the words a demangler writes for them.
_BUILTIN = {"f": ("float",), "d": ("double",), "i": ("int",), "j": ("unsigned", "int"),
            "l": ("long",), "m": ("unsigned", "long"), "b": ("bool",), "c": ("char",),
            "h": ("unsigned", "char"), "a": ("signed", "char"), "s": ("short",),
            "t": ("unsigned", "short"), "x": ("long",), "y": ("unsigned", "long")}
_TYPE_WORDS = frozenset(w for words in _BUILTIN.values() for w in words)


def is_mangled(name: str) -> bool:
    """Whether ``name`` is an Itanium-mangled symbol (``_Z…``)."""
    return name.startswith("_Z")


@functools.lru_cache(maxsize=4096)  # Tier 3 and coverage ask of the same few names
def _normalised(name: str) -> Tuple[str, bool]:
    """The demangled spelling with every tool's quirks undone, and whether the tool cut
    it short (Kineto's and nsys's tables end a long name with ``...``)."""
    text = " ".join((name or "").split())
    truncated = text.endswith("...") or text.endswith("…")
    text = text.rstrip(".…")
    text = _ANON_SPELLINGS.sub(_ANON, text)
    text = _INSTANCE.sub(lambda m: "{%s#%s}" % (m.group(1), m.group(2)), text)
    # A function as a template argument: c++filt writes its type around it
    # (``&(float f<S>(S*, int))``), ncu its name alone (``&f<S>``).
    text = _FUNCTION_ARG.sub(r"&\1", text)
    text = _CAST.sub("", text)
    text = _SUFFIX.sub(r"\1", text)
    text = re.sub(r"\b(true|false)\b", lambda m: _BOOL[m.group(1)], text)
    # One spacing: a blank only between two word characters (``unsigned int``,
    # ``void f``); ``> >``, ``char *`` and ``a, b`` lose theirs.
    text = re.sub(r" (?=\W)|(?<=\W) ", "", text)
    return text, truncated


def _cut(text: str) -> Tuple[str, int]:
    """The qualified name with its template arguments (no return type, no parameter
    list), and where its last component starts in it."""
    depth = 0
    end = len(text)
    last_space = -1
    last_colons = -1
    for i, ch in enumerate(text):
        if ch in "<({[":
            if ch == "(" and depth == 0 and i > 0 and text[i - 1] not in " :":
                end = i
                break
            depth += 1
        elif ch in ">)}]":
            depth = max(0, depth - 1)
        elif depth == 0 and ch == " ":
            last_space = i
        elif depth == 0 and ch == ":" and i + 1 < len(text) and text[i + 1] == ":":
            last_colons = i + 1
    head = text[last_space + 1:end]
    start = max(0, last_colons - last_space)
    return head, start


def _scan(text: str) -> Tuple[List[str], List[str]]:
    """The words of a normalised name: those that make its key (outside any parameter
    list but a lambda's, without ``void``/``const``), and all of them.

    Tools spell a template's nested function arguments differently (torch resolves their
    parameter lists, ncu writes ``(at::TensorIteratorBase &, const T1 &)`` and a return
    type), so parameter lists are no part of the key; a lambda's are (``lambda(c10::Half)``
    tells one dtype's instance from another's, and every tool writes it as declared).
    """
    key: List[str] = []
    every: List[str] = []
    skipping = 0
    prev = ""
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        before = text[m.start() - 1] if m.start() else ""
        if tok == "(":
            if skipping:
                skipping += 1
            elif before and (before.isalnum() or before in "_>)") and prev != "lambda":
                skipping = 1
            else:
                key.append(tok)
        elif tok == ")":
            if skipping:
                skipping -= 1
            else:
                key.append(tok)
        else:
            every.append(tok)
            # A qualifier (``at::``, ``native::``, ``<unnamed>::``) is left out: tools
            # disagree on namespaces (ncu 2025.3 writes ``at::elementwise_kernel`` where
            # torch 2.9 writes ``at::native::elementwise_kernel``), while the function,
            # its template arguments and the lambdas scoped in it are the kernel.
            qualifier = text.startswith("::", m.end()) and not tok.startswith("#")
            if not skipping and tok not in _KEYWORDS and not qualifier:
                key.append(tok)
        if tok not in ("(", ")"):
            prev = tok
    return key, every


def canonical(name: str) -> str:
    """One key for every demangled spelling of one kernel.

    ``void at::native::elementwise_kernel<(int)128, (int)4, …>(int, T3)`` and
    ``void at::native::elementwise_kernel<128, 4, …>(int, …)`` both give
    ``at native elementwise_kernel 128 4 …``: the words of the qualified name and its
    template arguments, parameter lists left out (see :func:`_scan`). A name cut short by
    its tool keeps what is left (:func:`same_kernel` knows it was cut). A mangled name is
    its own key: only another mangled name spells it the same way.
    """
    if is_mangled(name.strip()):
        return name.strip()
    text, _ = _normalised(name)
    head, _ = _cut(text)
    return " ".join(_scan(head or text)[0])


def base_name(name: str) -> str:
    """The function's own name, as ncu's ``--kernel-name-base function`` gives it:
    ``elementwise_kernel`` for any spelling of ``at::native::elementwise_kernel<…>``."""
    text = name.strip()
    if is_mangled(text):
        return _mangled(text)[0]
    if not text:
        return ""
    norm, _ = _normalised(text)
    head, start = _cut(norm)
    base = head[start:]
    lt = base.find("<")
    base = base[:lt] if lt > 0 else base
    # Only an identifier is a function's name (``operator()`` and debris are not).
    m = _IDENT_END.search(base)
    return m.group(0) if m is not None else ""


def _words(text: str) -> Tuple[Set[str], Set[str]]:
    """Identifiers and integer literals in a demangled (normalised) text."""
    ids: Set[str] = set()
    nums: Set[str] = set()
    for m in _WORD.finditer(text):
        word = m.group(0)
        if word[0].isdigit():
            before = text[m.start() - 1] if m.start() else ""
            # A lambda's number (``{lambda()#3}``) tells its instance, as the mangling's
            # closure number does; it is no template literal.
            nums.add("#" + word if before == "#" else word.lstrip("0") or "0")
        elif word in _TYPE_WORDS:
            nums.add("t:" + word)  # a builtin type tells float's instance from long's
        elif word not in _NOT_IDENTIFIERS and not _TEMPLATE_PARAM.match(word):
            ids.add(word)
    return ids, nums


@functools.lru_cache(maxsize=4096)  # Tier 3 and coverage ask of the same few names
def _mangled(name: str) -> Tuple[str, Set[str], Set[str]]:
    """The base name, source names, and the literals, lambda numbers (``#1``) and builtin
    types (``t:float``) an Itanium mangling spells.

    Not a demangler: it reads the source names (``<length><identifier>``) in order and
    steps over what would be misread as one (literals ``Li128E``, substitutions ``S0_``,
    template parameters ``T_``, a closure's ``E1_``, ``clEv``). The base name is the
    last source name of the outermost name, before its template arguments (``I``) or
    its end.
    """
    text = name.split(".")[0]  # a ``.clone``/``.constprop`` suffix is not the kernel's
    pos = 2 if text.startswith("_Z") else 0
    ids: Set[str] = set()
    nums: Set[str] = set()
    base = ""
    depth = 0  # template argument lists and nested names entered
    based = False
    closures = 0
    while pos < len(text):
        ch = text[pos]
        if ch.isdigit():
            m = re.match(r"\d+", text[pos:])
            assert m is not None
            length = int(m.group(0))
            ident = text[pos + len(m.group(0)):pos + len(m.group(0)) + length]
            pos += len(m.group(0)) + length
            if ident.startswith("_GLOBAL__N"):
                continue
            ids.add(ident)
            if depth <= 1 and not based:
                base = ident
            continue
        m = _ENUM_LITERAL.match(text, pos)
        if m is not None and len(m.group(2)) >= int(m.group(1)):
            # ``L14curandOrdering101E``: an enum's literal, written ``101`` or
            # ``(curandOrdering)101``.
            name_len = int(m.group(1))
            ids.add(m.group(2)[:name_len])
            rest = re.match(r"n?(\d+)E", m.group(2)[name_len:])
            if rest is not None:
                nums.add(rest.group(1).lstrip("0") or "0")
            pos = m.end()
            continue
        if text.startswith(("Xad", "L_Z"), pos):
            pos += 3  # ``&f<…>`` as a template argument: the function's own encoding follows
            continue
        if text.startswith(("cl", "ix"), pos) or (ch == "D" and pos + 1 < len(text)):
            pos += 2  # ``operator()``/``operator[]``, a ``D``-prefixed type (``Dv``, ``Dh``)
            continue
        m = _UNNAMED_TYPE.match(text, pos)
        if m is not None:
            pos = m.end()
            continue
        if ch in _BUILTIN:
            nums.update("t:" + word for word in _BUILTIN[ch])
            pos += 1
            continue
        for pattern in (_LITERAL, _SUBSTITUTION, _TEMPLATE_REF):
            m = pattern.match(text, pos)
            if m is not None:
                if pattern is _LITERAL:
                    nums.add(m.group(3).lstrip("0") or "0")
                pos = m.end()
                break
        else:
            if text.startswith("Ul", pos):
                closures += 1
                pos += 2
                depth += 1
                continue
            if ch == "E" and closures:
                m = _CLOSURE_END.match(text, pos)
                if m is not None:
                    # ``E_`` is the first lambda of its scope (``#1``), ``E0_`` the second.
                    digits = m.group(0)[1:-1]
                    nums.add("#%d" % (int(digits) + 2 if digits else 1))
                    closures -= 1
                    depth = max(0, depth - 1)
                    pos = m.end()
                    continue
            if ch == "N" and depth == 0 and not based:
                depth = 1
            elif ch == "I":
                if depth <= 1:
                    based = True
                depth += 1
            elif ch == "E":
                depth = max(0, depth - 1)
                if depth == 0:
                    based = True
            elif ch == "L" and pos == 2:
                pass  # internal linkage: ``_ZL6kernel…``
            pos += 1
    return base, ids, nums


@functools.lru_cache(maxsize=4096)  # Tier 3 and coverage ask of the same few names
def _signature(name: str) -> Tuple[str, Set[str], Set[str], Set[str], Set[str]]:
    """(base, identifiers and numbers of the name without its parameter list, and of the
    whole name) of a demangled or mangled name."""
    if is_mangled(name.strip()):
        base, ids, nums = _mangled(name.strip())
        return base, ids, nums, ids, nums
    norm, _ = _normalised(name)
    head, _ = _cut(norm)
    ids, nums = _words(head)
    all_ids, all_nums = _words(norm)
    return base_name(name), ids, nums, all_ids, all_nums


def same_kernel(a: str, b: str) -> Optional[str]:
    """How surely ``a`` and ``b`` name the same kernel: a grade of :data:`GRADES`, or None.

    - ``exact``: the same :func:`canonical` key (or one cut short and the other
      continuing it);
    - ``template``: a mangled name against another spelling: the same base name, and the
      identifiers, integer literals and lambda numbers agree (builtin types, which the
      mangling writes as letters, are not compared);
    - ``base``: the same base name only (``elementwise_kernel`` against any instance).
    """
    a, b = (a or "").strip(), (b or "").strip()
    if not a or not b:
        return None
    if not is_mangled(a) and not is_mangled(b):
        _, cut_a = _normalised(a)
        _, cut_b = _normalised(b)
        ka, kb = canonical(a), canonical(b)
        if ka == kb or (cut_a and kb.startswith(ka)) or (cut_b and ka.startswith(kb)):
            return EXACT
        # Two demangled spellings whose words differ are two instances (lambda #7 and
        # #8 of one dispatch, float and Half): the same base name is all they share.
        base = base_name(a)
        return BASE if base and base == base_name(b) else None
    if is_mangled(a) and is_mangled(b) and canonical(a) == canonical(b):
        return EXACT
    sa, sb = _signature(a), _signature(b)
    if not sa[0] or sa[0] != sb[0]:
        return None
    if is_mangled(a) != is_mangled(b):
        dem, mangled = (sb, sa) if is_mangled(a) else (sa, sb)
        if _agree(dem, mangled):
            return TEMPLATE
    return BASE


def _agree(dem: Tuple[str, Set[str], Set[str], Set[str], Set[str]],
           mangled: Tuple[str, Set[str], Set[str], Set[str], Set[str]]) -> bool:
    """A demangled name and a mangled one spell the same instance: the identifiers of the
    demangled name's template arguments are source names of the mangled one, and both
    hold the same literals, lambda numbers and builtin types (the mangled ones somewhere
    in the demangled name, its parameter list included). Identifiers are compared one
    way only: a demangler may leave out a namespace the mangling spells (ncu 2025.3
    writes ``at::reduce_kernel`` for ``_ZN2at6native13reduce_kernel…``)."""
    if len(dem[1]) + len(dem[2]) <= 1:
        return False  # a bare function name: no template to compare
    return dem[1] <= mangled[3] and dem[2] <= mangled[4] and mangled[2] <= dem[4]


def best_match(name: str, candidates: Iterable[str]) -> Tuple[Optional[str], Optional[str]]:
    """The candidate that most surely names the same kernel as ``name``, and its grade.

    Among several of the same grade the first wins, except that a ``base`` grade is only
    taken when no other candidate shares the base name (which instance would be a guess).
    """
    found: Dict[str, List[str]] = {g: [] for g in GRADES}
    for cand in candidates:
        grade = same_kernel(name, cand)
        if grade is not None and cand not in found[grade]:
            found[grade].append(cand)
    for grade in (EXACT, TEMPLATE):
        if found[grade]:
            return found[grade][0], grade
    if len(found[BASE]) == 1:
        return found[BASE][0], BASE
    return None, None


# ----------------------------------------------------------------------------- ncu regex
#: A parameter list (three levels of parentheses deep) or a cast, as ncu writes it.
_PARAMS = r"\([^()]*(\([^()]*(\([^()]*\)[^()]*)*\)[^()]*)*\)"
#: Between two words of a name: punctuation (``::``, ``<``, ``, ``, ``> >``), a
#: parameter list or cast, the words tools add or leave out (``void``, ``const``) and
#: qualifiers (``at::native::``, which :func:`canonical` leaves out). Each alternative
#: is bounded by its own characters, so the engine never backtracks far.
_GAP = r"([^A-Za-z0-9_()#]|%s|void|const|volatile|unnamed|[A-Za-z_][A-Za-z0-9_]*::)*" % _PARAMS
_ANON_RE = r"(\(anonymous namespace\)|unnamed|anonymous_namespace|_GLOBAL__N_1)"
_END = "([^A-Za-z0-9_]|$)"
_SPECIAL = set("\\.^$|?*+()[]{}")


def _escape(word: str) -> str:
    return "".join("\\" + c if c in _SPECIAL else c for c in word)


def _token_regex(token: str) -> str:
    if token == _ANON:
        return _ANON_RE
    if token.startswith("#"):
        n = token[1:]
        return r"(#%s|\(instance %s\))" % (n, n)  # c++filt's ``#1``, ncu's ``(instance 1)``
    if token.isdigit():
        alt = {"1": "|true", "0": "|false"}.get(token, "")
        return "(%s[uUlL]*%s)" % (token, alt)
    return _escape(token)


def ncu_regex(name: str) -> str:
    """A ``-k regex:`` body over demangled names that matches every spelling of ``name``.

    It starts at the base name (``(^|[^A-Za-z0-9_])elementwise_kernel``, so
    ``vectorized_elementwise_kernel`` is not taken for it) and goes on word by word through
    the template arguments (:func:`canonical`'s words), each gap between two words any
    punctuation, parameter list, cast, ``void`` or ``const``; numbers take a suffix
    (``1ul``) or ``true``/``false``, the anonymous namespace and a lambda's number every
    tool's spelling. It takes every word that fits in :data:`MAX_REGEX`, not just enough
    to tell Tier 2's rows apart: a sibling ncu sees but Tier 2 did not (another instance
    of the same template) must not pass for the kernel. A name cut short by its tool ends
    where it was cut.

    Only grouping, alternation, ``*`` and bracket classes are used: the regex means the
    same to ncu's engine and to Python's :mod:`re`.

    Args:
        name: the kernel as Tier 2 named it (demangled; a mangled name gives its base).
    """
    base = base_name(name)
    if not base:
        # No function name to start from: the name itself, as it was given.
        return _escape(" ".join(name.split())[:MAX_REGEX // 2])
    start = "(^|[^A-Za-z0-9_])" + _escape(base)
    if is_mangled(name.strip()):
        return start + _END
    norm, cut = _normalised(name)
    head, at = _cut(norm)
    words = _scan(head[at + len(base):])[0]
    if cut and words:
        words = words[:-1]  # the last word may be cut in the middle
    parts = [start]
    size = len(start) + len(_END)
    last = base
    for word in words:
        piece = _GAP + _token_regex(word)
        if size + len(piece) > MAX_REGEX:
            break
        parts.append(piece)
        size += len(piece)
        last = word
    # The last word ends where a word ends (``128`` is not ``1280``); after a lambda's
    # parenthesis the next character is a word's.
    return "".join(parts) + ("" if last in ("(", ")") else _END)
