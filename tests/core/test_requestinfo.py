"""The classifier against kube-apiserver's own table (``requestinfo_test.go``), case by case.

The cases of ``TestGetAPIRequestInfo``, ``TestGetNonAPIRequestInfo`` and
``TestFieldSelectorParsing`` from
``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo_test.go`` are copied
as they are written there (method, URL, verb, prefix, group, version, namespace,
resource, subresource, name, parts); then the gateway's own decisions on top: the
admission operation and long-running-ness, from the handlers, the installer and
``BasicLongRunningRequestCheck``.
"""

from __future__ import annotations

import pytest

from bcs_middleware.core.requestinfo import CONNECTERS, classify, parse_query
from bcs_middleware.core.selectors import SelectorError, field_selector_exact, parse_label_selector


def _split(url: str) -> tuple[str, str]:
    path, _, query = url.partition("?")
    return path, query


# TestGetAPIRequestInfo successCases: method, url, verb, prefix, group, version, namespace,
# resource, subresource, name, parts.
SUCCESS_CASES = [
    # resource paths
    ("GET", "/api/v1/namespaces", "list", "api", "", "v1", "", "namespaces", "", "", ["namespaces"]),
    ("GET", "/api/v1/namespaces/other", "get", "api", "", "v1", "other", "namespaces", "", "other",
     ["namespaces", "other"]),
    ("GET", "/api/v1/namespaces/other/pods", "list", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", ["pods", "foo"]),
    ("HEAD", "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo",
     ["pods", "foo"]),
    ("GET", "/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("HEAD", "/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", ["pods", "foo"]),
    ("GET", "/api/v1/namespaces/other/pods", "list", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    # The stored table expects namespace "" here: that line came with kubernetes/kubernetes#94656, which was
    # closed unmerged in favour of #95012 (which made POST populate the namespace too). requestinfo.go on
    # master sets the namespace to the name, as for the GET above; the code is followed.
    ("PATCH", "/api/v1/namespaces/new-namespace", "patch", "api", "", "v1", "new-namespace", "namespaces", "",
     "new-namespace", ["namespaces", "new-namespace"]),
    # special verbs
    ("GET", "/api/v1/proxy/namespaces/other/pods/foo", "proxy", "api", "", "v1", "other", "pods", "", "foo",
     ["pods", "foo"]),
    ("GET", "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource", "proxy", "api", "", "v1", "other",
     "pods", "", "foo", ["pods", "foo", "subpath", "not", "a", "subresource"]),
    ("GET", "/api/v1/watch/pods", "watch", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/pods?watch=true", "watch", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/pods?watch=false", "list", "api", "", "v1", "", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/watch/namespaces/other/pods", "watch", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/namespaces/other/pods?watch=1", "watch", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    ("GET", "/api/v1/namespaces/other/pods?watch=0", "list", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    # subresource identification
    ("GET", "/api/v1/namespaces/other/pods/foo/status", "get", "api", "", "v1", "other", "pods", "status", "foo",
     ["pods", "foo", "status"]),
    ("GET", "/api/v1/namespaces/other/pods/foo/proxy/subpath", "get", "api", "", "v1", "other", "pods", "proxy", "foo",
     ["pods", "foo", "proxy", "subpath"]),
    ("PUT", "/api/v1/namespaces/other/finalize", "update", "api", "", "v1", "other", "namespaces", "finalize",
     "other", ["namespaces", "other", "finalize"]),
    ("PUT", "/api/v1/namespaces/other/status", "update", "api", "", "v1", "other", "namespaces", "status", "other",
     ["namespaces", "other", "status"]),
    # verb identification
    ("PATCH", "/api/v1/namespaces/other/pods/foo", "patch", "api", "", "v1", "other", "pods", "", "foo",
     ["pods", "foo"]),
    ("DELETE", "/api/v1/namespaces/other/pods/foo", "delete", "api", "", "v1", "other", "pods", "", "foo",
     ["pods", "foo"]),
    ("POST", "/api/v1/namespaces/other/pods", "create", "api", "", "v1", "other", "pods", "", "", ["pods"]),
    # deletecollection verb identification
    ("DELETE", "/api/v1/nodes", "deletecollection", "api", "", "v1", "", "nodes", "", "", ["nodes"]),
    ("DELETE", "/api/v1/namespaces", "deletecollection", "api", "", "v1", "", "namespaces", "", "", ["namespaces"]),
    ("DELETE", "/api/v1/namespaces/other/pods", "deletecollection", "api", "", "v1", "other", "pods", "", "",
     ["pods"]),
    ("DELETE", "/apis/extensions/v1/namespaces/other/pods", "deletecollection", "api", "extensions", "v1", "other",
     "pods", "", "", ["pods"]),
    # api group identification
    ("POST", "/apis/extensions/v1/namespaces/other/pods", "create", "api", "extensions", "v1", "other", "pods", "",
     "", ["pods"]),
    # api version identification
    ("POST", "/apis/extensions/v1beta3/namespaces/other/pods", "create", "api", "extensions", "v1beta3", "other",
     "pods", "", "", ["pods"]),
]


@pytest.mark.parametrize(
    "method, url, verb, prefix, group, version, namespace, resource, subresource, name, parts",
    [pytest.param(*case, id=f"{case[0]} {case[1]}") for case in SUCCESS_CASES],
)
def test_get_api_request_info(method: str, url: str, verb: str, prefix: str, group: str, version: str,
                              namespace: str, resource: str, subresource: str, name: str, parts: list[str]) -> None:
    info = classify(method, *_split(url))
    assert info.is_resource
    assert (info.verb, info.api_group, info.api_version, info.namespace, info.resource, info.subresource,
            info.name, list(info.parts)) == (verb, group, version, namespace, resource, subresource, name, parts)
    # The Go table's expectedAPIPrefix is "api" for every case and never compared; ours is the real prefix.
    assert info.api_prefix == url.split("/")[1]


@pytest.mark.parametrize("url", [
    pytest.param("/", id="no resource path"),
    pytest.param("/api/version/", id="just apiversion"),
    pytest.param("/apis/group/version/", id="just prefix, group, version"),
    pytest.param("/api/version/", id="apiversion with no resource"),
    pytest.param("/badprefix/version/resource", id="bad prefix"),
    pytest.param("/apis/version/resource", id="missing api group"),
])
def test_get_api_request_info_error_cases_are_non_resource_requests(url: str) -> None:
    info = classify("GET", url)
    assert not info.is_resource and info.verb == "get" and info.path == url


@pytest.mark.parametrize("url, expected", [
    pytest.param("/api/version/resource", True, id="simple groupless"),
    pytest.param("/apis/group/version/resource/name/subresource", True, id="simple group"),
    pytest.param("/api/version/resource/name/subresource", True, id="more steps"),
    pytest.param("/apis/batch/v1/job", True, id="group list"),
    pytest.param("/apis/batch/v1/job/foo", True, id="group get"),
    pytest.param("/apis/batch/v1/job/foo/scale", True, id="group subresource"),
    pytest.param("/not-api/version/resource", False, id="bad root"),
    pytest.param("/apis/extensions/v1beta1", False, id="group without enough steps"),
    pytest.param("/apis/extensions/v1beta1/", False, id="group without enough steps 2"),
    pytest.param("/api/version", False, id="not enough steps"),
    pytest.param("/api", False, id="one step"),
    pytest.param("/", False, id="zero step"),
    pytest.param("", False, id="empty"),
])
def test_get_non_api_request_info(url: str, expected: bool) -> None:
    assert classify("GET", url).is_resource is expected


@pytest.mark.parametrize("url, name, verb", [
    pytest.param("/apis/group/version/resource", "", "list", id="no selector"),
    pytest.param("/apis/group/version/resource?fieldSelector=metadata.name=name1", "name1", "list",
                 id="metadata.name selector"),
    pytest.param("/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1", "name1", "watch",
                 id="metadata.name selector with watch"),
    pytest.param("/apis/group/version/resource?fieldSelector=foo=bar", "", "list", id="random selector"),
    pytest.param("/apis/group/version/resource?fieldSelector=metadata.name=name1,foo", "", "list",
                 id="invalid selector with metadata.name"),
    pytest.param("/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true", "", "watch",
                 id="invalid selector with metadata.name with watch"),
    pytest.param("/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false", "", "list",
                 id="invalid selector with metadata.name with watch false"),
])
def test_field_selector_parsing(url: str, name: str, verb: str) -> None:
    info = classify("GET", *_split(url))
    assert (info.name, info.verb) == (name, verb)


# ---------------------------------------------------------------------------------- beyond the Go table
# The same rules, read from requestinfo.go and the ListOptions conversion: each case a branch of the code.

@pytest.mark.parametrize("url, name, verb, field, label", [
    pytest.param("/api/v1/pods?fieldSelector=metadata.name%3D%3Dweb", "web", "list", "metadata.name==web", "",
                 id="double-equals-names-it"),
    pytest.param("/api/v1/pods?fieldSelector=metadata.name!%3Dweb", "", "list", "metadata.name!=web", "",
                 id="not-equals-does-not"),
    pytest.param("/api/v1/pods?fieldSelector=metadata.name%3Da%2Fb", "", "list", "metadata.name=a/b", "",
                 id="a-name-that-is-no-path-segment-is-not-taken"),
    pytest.param("/api/v1/pods?fieldSelector=metadata.name%3D..", "", "list", "metadata.name=..", "",
                 id="dot-dot-is-not-a-name"),
    pytest.param("/api/v1/pods?fieldSelector=metadata.name%3Dweb&limit=ten", "", "list", "metadata.name=web", "",
                 id="an-undecodable-limit-drops-the-name"),
    pytest.param("/api/v1/pods?fieldSelector=metadata.name%3Dweb&labelSelector=a%20in%20b", "", "list",
                 "metadata.name=web", "a in b", id="an-unparsable-label-selector-drops-the-name"),
    pytest.param("/api/v1/pods?fieldSelector=metadata.name%3Dweb&labelSelector=app%20in%20(a,b),!old", "web",
                 "list", "metadata.name=web", "app in (a,b),!old", id="a-set-based-label-selector-keeps-it"),
    pytest.param("/api/v1/pods?watch=", "", "watch", "", "", id="empty-watch-is-true-as-go-converts-it"),
    pytest.param("/api/v1/pods?watch=FALSE", "", "list", "", "", id="watch-false-any-case"),
    pytest.param("/api/v1/watch/pods?fieldSelector=a%3Db", "", "watch", "", "",
                 id="verb-prefix-keeps-no-selectors"),
    pytest.param("/api/v1/pods?fieldSelector=a%3Db;c", "", "list", "", "",
                 id="a-semicolon-drops-the-pair-as-go-does"),
])
def test_selectors_and_names_from_the_query(url: str, name: str, verb: str, field: str, label: str) -> None:
    info = classify("GET", *_split(url))
    assert (info.name, info.verb, info.field_selector, info.label_selector) == (name, verb, field, label)


def test_deletecollection_keeps_its_selectors_and_stays_nameless() -> None:
    info = classify("DELETE", "/api/v1/namespaces/n/pods", "labelSelector=app%3Dweb&fieldSelector=metadata.name%3Dx")
    assert (info.verb, info.name, info.label_selector, info.field_selector) == (
        "deletecollection", "", "app=web", "metadata.name=x")
    assert info.admission_operation == "DELETE"


@pytest.mark.parametrize("method, url, operation", [
    pytest.param("POST", "/api/v1/namespaces/n/pods", "CREATE", id="create"),
    pytest.param("POST", "/api/v1/namespaces/n/pods/p/eviction", "CREATE", id="create-subresource"),
    pytest.param("POST", "/api/v1/namespaces/n/serviceaccounts/sa/token", "CREATE", id="token-request"),
    pytest.param("PUT", "/apis/apps/v1/namespaces/n/deployments/d", "UPDATE", id="update"),
    pytest.param("PUT", "/apis/apps/v1/namespaces/n/deployments/d/scale", "UPDATE", id="update-subresource"),
    pytest.param("PATCH", "/api/v1/namespaces/n/pods/p", "UPDATE", id="patch"),
    pytest.param("DELETE", "/api/v1/namespaces/n/pods/p", "DELETE", id="delete"),
    pytest.param("DELETE", "/api/v1/namespaces/n/pods", "DELETE", id="deletecollection"),
    pytest.param("DELETE", "/api/v1/namespaces/n", "DELETE", id="delete-namespace"),
    pytest.param("GET", "/api/v1/namespaces/n/pods/p", None, id="get"),
    pytest.param("GET", "/api/v1/namespaces/n/pods", None, id="list"),
    pytest.param("GET", "/api/v1/watch/namespaces/n/pods", None, id="watch"),
    pytest.param("GET", "/api/v1/namespaces/n/pods/p/log", None, id="log"),
    pytest.param("OPTIONS", "/api/v1/namespaces/n/pods/p", None, id="options-on-an-object"),
    pytest.param("GET", "/version", None, id="non-resource"),
    pytest.param("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "CREATE", id="review"),
    # a CONNECT is no core matter outside the core group: a CRD's "exec" is an ordinary subresource
    pytest.param("POST", "/apis/example.com/v1/namespaces/n/pods/p/exec", "CREATE", id="not-core-exec"),
])
def test_admission_operation(method: str, url: str, operation: str | None) -> None:
    assert classify(method, *_split(url)).admission_operation == operation


CONNECT_PATHS = [
    "/api/v1/namespaces/n/pods/p/exec",
    "/api/v1/namespaces/n/pods/p/attach",
    "/api/v1/namespaces/n/pods/p/portforward",
    "/api/v1/namespaces/n/pods/p/proxy",
    "/api/v1/namespaces/n/pods/p/proxy/",
    "/api/v1/namespaces/n/pods/https:p:8443/proxy/metrics/a",
    "/api/v1/nodes/node-1/proxy",
    "/api/v1/nodes/node-1:10250/proxy/stats/summary",
    "/api/v1/namespaces/n/services/svc/proxy",
    "/api/v1/namespaces/n/services/https:svc:443/proxy/healthz",
    "/api/v1/proxy/namespaces/n/pods/p/x",
    "/api/v1/proxy/nodes/node-1/stats",
    "/api/v1/proxy/namespaces/n/services/svc:80/",
]


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
@pytest.mark.parametrize("path", CONNECT_PATHS)
def test_every_method_on_a_connecter_is_connect(method: str, path: str) -> None:
    """installer.go routes every method it registers for a connecter to ConnectResource."""
    info = classify(method, path, "command=sh")
    assert info.admission_operation == "CONNECT" and info.connect and info.long_running
    assert info.connect_subresource in {sub for _, sub in CONNECTERS}


@pytest.mark.parametrize("method, url, long_running", [
    pytest.param("GET", "/api/v1/pods?watch=1", True, id="watch-param"),
    pytest.param("GET", "/api/v1/watch/pods", True, id="watch-prefix"),
    pytest.param("GET", "/api/v1/namespaces/n/pods/p/log", True, id="log-follow-or-not"),
    pytest.param("POST", "/api/v1/namespaces/n/pods/p/exec", True, id="exec"),
    pytest.param("GET", "/api/v1/namespaces/n/pods/p/attach", True, id="attach"),
    pytest.param("GET", "/api/v1/namespaces/n/pods/p/portforward", True, id="portforward"),
    pytest.param("GET", "/api/v1/nodes/x/proxy/metrics", True, id="proxy-subresource"),
    pytest.param("GET", "/api/v1/proxy/nodes/x", True, id="proxy-verb"),
    pytest.param("GET", "/debug/pprof/heap", True, id="pprof"),
    pytest.param("GET", "/api/v1/pods", False, id="list"),
    pytest.param("GET", "/api/v1/namespaces/n/pods/p/status", False, id="status"),
    pytest.param("GET", "/version", False, id="version"),
])
def test_long_running(method: str, url: str, long_running: bool) -> None:
    assert classify(method, *_split(url)).long_running is long_running


@pytest.mark.parametrize("query, expected", [
    pytest.param("a=1&a=2&b", {"a": ["1", "2"], "b": [""]}, id="repeats-and-bare-keys"),
    pytest.param("command=ls;rm", {}, id="semicolon-drops-the-pair"),
    pytest.param("c=%zz&d=ok", {"d": ["ok"]}, id="bad-escape-drops-the-pair"),
    pytest.param("c=%4", {}, id="short-escape"),
    pytest.param("x=a+b%2Bc", {"x": ["a b+c"]}, id="plus-is-space"),
    pytest.param("x=%ff", {"x": ["\ufffd"]}, id="invalid-utf8-as-go-json-writes-it"),
    pytest.param("&&x=1&", {"x": ["1"]}, id="empty-pieces"),
])
def test_parse_query_reads_as_go_does(query: str, expected: dict[str, list[str]]) -> None:
    assert parse_query(query) == expected


@pytest.mark.parametrize("selector", [
    "", "a", "!a", "a=b", "a==b", "a!=b", "a in (b,c)", "a notin (b)", "a in ()", "a in (,b)", "a>1", "a<2",
    "example.com/a=b", "a=", "a,b=c , !d", "in in (in)", "a in (b,,c)",
])
def test_label_selectors_that_parse(selector: str) -> None:
    parse_label_selector(selector)


@pytest.mark.parametrize("selector", [
    "a in b", "a=b=c", "a>b", "a<-2", "=a", "a,", "!a=b", "a in (b", "-a=b", "a=-b", "a/b/c=d", "Example.com/a=b",
    "x" * 64 + "=b", "a=" + "v" * 64, "a b", "(a)",
])
def test_label_selectors_that_do_not(selector: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(selector)


@pytest.mark.parametrize("selector, value", [
    ("metadata.name=a", "a"), ("b=c,metadata.name==a", "a"), ("metadata.name!=a", None),
    (r"metadata.name=a\,b", "a,b"), ("metadata.namespace=a", None), ("metadata.name=b,metadata.name=a", "a"),
])
def test_field_selector_exact_match(selector: str, value: str | None) -> None:
    assert field_selector_exact(selector, "metadata.name") == value


@pytest.mark.parametrize("selector", ["a", "metadata.name=a,b", "metadata.name=a=b", "x=a\\"])
def test_field_selectors_that_do_not_parse(selector: str) -> None:
    with pytest.raises(SelectorError):
        field_selector_exact(selector, "metadata.name")
