"""TLS settings of a client: the CA to trust, and a client certificate
when the replicas require one (``latchkey serve --client-cert-auth``)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import grpc

PathLike = Union[str, Path]


@dataclass(frozen=True)
class Tls:
    """PEM files, as ``latchkey certs`` writes them: ``ca`` (``ca.pem``) and,
    for mutual TLS, ``cert`` and ``key`` (``client.pem``,
    ``client-key.pem``)."""

    ca: PathLike
    cert: Optional[PathLike] = None
    key: Optional[PathLike] = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise ValueError("latchkey: a client certificate needs both cert and key")
        read = lambda p: Path(p).read_bytes()  # noqa: E731
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca),
            private_key=read(self.key) if self.key is not None else None,
            certificate_chain=read(self.cert) if self.cert is not None else None,
        )
