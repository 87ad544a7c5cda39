"""The HTTP session of the S3 client: its TLS settings loaded once per SSL context.

botocore hands urllib3 the client certificate and the CA bundle as file names, and urllib3
loads them into the session's one shared SSLContext at every new connection. With parallel
part uploads (S3Settings.part_workers) one thread then replaces the context's key while
others make connections from it, which OpenSSL does not allow ("an SSL_CTX object should not
be changed after it is used to create any SSL objects"): seen here as handshakes failing
with "unknown key type" or "unable to get certs public key", and as a process stuck for good
in SSL_free (urllib3 issue 3036). This session loads both into each context when it is made
and gives urllib3 no files, so nothing changes a context that is in use.
"""

from __future__ import annotations

import ssl
from typing import Any

from botocore.httpsession import URLLib3Session, get_cert_path


class LoadedOnceSession(URLLib3Session):
    def __init__(
        self, *args: Any, client_cert: tuple[str, str] | None = None, **kwargs: Any
    ) -> None:
        self._client_chain = client_cert
        self._trust = kwargs.get("verify", True)
        super().__init__(*args, client_cert=None, **kwargs)

    def _get_pool_manager_kwargs(self, **extra_kwargs: Any) -> dict[str, Any]:
        # The contexts of connections to the endpoint (direct or through a proxy's tunnel);
        # a proxy's own context (_setup_proxy_ssl_context) keeps the proxy settings only.
        kwargs = super()._get_pool_manager_kwargs(**extra_kwargs)
        context = kwargs["ssl_context"]
        if self._trust:
            context.load_verify_locations(get_cert_path(self._trust))
        if self._client_chain:
            context.load_cert_chain(*self._client_chain)
        return kwargs

    def _setup_ssl_cert(self, conn: Any, url: str, verify: Any) -> None:
        super()._setup_ssl_cert(conn, url, verify)
        conn.ca_certs = None  # loaded into the context already


def load_tls_once(client: Any, client_cert: tuple[str, str] | None) -> Any:
    """Give a boto3 client made with verify= and Config(client_cert=...) the session above,
    with the same pool size, timeouts, socket options and proxies as botocore chose."""
    endpoint = client._endpoint
    made = endpoint.http_session
    timeout = made._timeout
    if not isinstance(timeout, int | float):
        timeout = (timeout.connect_timeout, timeout.read_timeout)
    try:
        session = LoadedOnceSession(
            verify=made._verify,
            timeout=timeout,
            max_pool_connections=made._max_pool_connections,
            socket_options=made._socket_options,
            client_cert=client_cert,
        )
    except (ssl.SSLError, OSError):
        # A file that does not load (missing, not PEM, a key that is not the certificate's):
        # the client keeps botocore's session, whose first request fails with the error the
        # store explains (S3Store._classify), where and when it did before.
        return client
    session._proxy_config = made._proxy_config
    endpoint.http_session = session
    made.close()
    return client
