"""The management API served on its own: paste app ``egg:bcs-middleware#management_api``.

Configured as the gateway is — the same ini keys (:data:`.ini.MANAGEMENT_KEYS`, a part of the
gateway's), read into the same typed sections (:class:`.config.ManagementConfig`) — and its
:class:`~bcs_middleware.apps.management.calls.APISettings` made from them by
:func:`api_settings`, which the gateway's own management API uses too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..apps.management.app import ManagementAPI
from ..apps.management.calls import APISettings
from ..outbound.addresses import AddressPolicy
from .config import SelfServiceSettings, ServerSettings
from .ini import management_config
from .resources import Certificates, read_certificates


def api_settings(server: ServerSettings, self_service: SelfServiceSettings, certificates: Certificates, *,
                 address_policy: AddressPolicy | None = None) -> APISettings:
    """What the management API hands out and bounds, from the configuration's sections and the
    certificate files' contents."""
    return APISettings(
        gateway_ca_pem=certificates.gateway_ca,
        gateway_cert_pem=certificates.gateway_cert.encode() if certificates.gateway_cert is not None else None,
        public_url=server.public_url, max_body=server.max_body, address_policy=address_policy,
        quotas=self_service.quotas, cluster_creators=self_service.cluster_creators,
    )


def app_factory(global_conf: Mapping[str, Any], **local_conf: Any) -> ManagementAPI:
    """PasteDeploy app ``egg:bcs-middleware#management_api`` (put ``token_auth`` in front)::

        [app:api]
        use = egg:bcs-middleware#management_api
        database_url = postgresql://bcs@db/bcs
        gateway_ca_file = /etc/bcs/ca.crt
        max_body = 1MiB
        # who may register clusters: everyone | superusers | user:NAME group:NAME ...
        cluster_creators = everyone
        # per-user quotas (a number, or unlimited; superusers are exempt)
        quota_clusters_per_user = 50
        quota_tokens_per_user = 20
        quota_webhook_configurations_per_cluster = 20
        quota_permissions_per_cluster = 200
    """
    from ..store.sql import open_store

    config = management_config("app:management_api", local_conf)
    store = open_store(config.store.database_url, data_dir=config.store.data_dir,
                       secret_key=config.store.secret_key)
    return ManagementAPI(store, settings=api_settings(config.server, config.self_service,
                                                      read_certificates(config.server)))
