"""LanguageTool as a grammar checker (GC): one place that talks to it.

No package registry ships LanguageTool (its Java server is a separate ~200 MB
download). Give a running server's URL or an unpacked LanguageTool folder (needs Java),
or set $REXEVAL_LANGUAGETOOL; without one the caller is told why there is no checker.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

LANGUAGETOOL_ENV = "REXEVAL_LANGUAGETOOL"


class LanguageToolClient:
    """Counts LanguageTool matches per text through its HTTP API (`/v2/check`)."""

    def __init__(self, url: str, language: str = "en-US", timeout: float = 60.0, transport=None):
        import httpx

        self.url = url.rstrip("/")
        self.url = self.url.removesuffix("/v2")
        self.language = language
        self.client = httpx.Client(timeout=timeout, transport=transport)

    def ping(self) -> None:
        """Raise ValueError when no LanguageTool answers at the URL."""
        import httpx

        try:
            self.client.get(f"{self.url}/v2/languages").raise_for_status()
        except httpx.HTTPError as exc:
            raise ValueError(f"no LanguageTool server answers at {self.url}: {exc}") from None

    def count_errors(self, texts: Sequence[str]) -> list[int]:
        out = []
        for text in texts:
            resp = self.client.post(f"{self.url}/v2/check", data={"text": text, "language": self.language})
            resp.raise_for_status()
            out.append(len(resp.json().get("matches") or []))
        return out

    def __getstate__(self):  # picklable for Ray actors: rebuild the HTTP client there
        return {"url": self.url, "language": self.language}

    def __setstate__(self, state):
        self.__init__(state["url"], state["language"])


def find_server_jar(folder: str | Path) -> Path:
    """languagetool-server.jar inside an unpacked LanguageTool folder (or one level down)."""
    folder = Path(folder)
    for pattern in ("languagetool-server.jar", "*/languagetool-server.jar"):
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
    raise FileNotFoundError(f"{folder}: no languagetool-server.jar (unpack a LanguageTool release there)")


class LocalLanguageTool:
    """A LanguageTool server started from a local folder on 127.0.0.1, stopped by `close()`."""

    def __init__(self, folder: str | Path, language: str = "en-US", start_timeout: float = 120.0):
        jar = find_server_jar(folder)
        java = shutil.which("java")
        if java is None:
            raise ValueError("LanguageTool needs Java: no `java` on PATH")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [java, "-cp", str(jar), "org.languagetool.server.HTTPServer", "--port", str(port)],
            cwd=jar.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = LanguageToolClient(f"http://127.0.0.1:{port}", language)
        deadline = time.time() + start_timeout
        while True:
            try:
                self.client.ping()
                break
            except ValueError:
                if self.process.poll() is not None or time.time() > deadline:
                    self.close()
                    raise ValueError(f"LanguageTool from {jar} did not start (exit code "
                                     f"{self.process.returncode}) within {start_timeout:.0f}s") from None
                time.sleep(1.0)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


GRAMMAR_UNAVAILABLE = ("LanguageTool is not installed: no package registry ships it offline; "
                       f"pass --languagetool URL (a running server) or FOLDER (an unpacked release; "
                       f"needs Java), or set ${LANGUAGETOOL_ENV}")


def open_grammar_checker(spec: str | None, language: str = "en-US"):
    """(checker or None, note, closer) for a LanguageTool URL, a folder, or nothing.

    Nothing given (and no environment variable): no checker and the reason. Something
    given that does not work is an error, not a silent fallback.
    """
    spec = spec or os.environ.get(LANGUAGETOOL_ENV) or None
    if not spec:
        return None, GRAMMAR_UNAVAILABLE, (lambda: None)
    if spec.startswith(("http://", "https://")):
        client = LanguageToolClient(spec, language)
        client.ping()
        return client, f"LanguageTool server at {spec}", (lambda: None)
    if not Path(spec).is_dir():
        raise FileNotFoundError(f"languagetool: {spec} is neither an http(s) URL nor a folder")
    server = LocalLanguageTool(spec, language)
    return server.client, f"LanguageTool started from {spec}", server.close
