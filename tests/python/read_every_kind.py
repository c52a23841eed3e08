"""Reads every object kind the API serves back through the official Kubernetes Python
client's models, as a Python program using that client would.

Usage: python read_every_kind.py NAMESPACE  (the cluster is $KUBECONFIG's)

The API's discovery (/api, /apis and each group version's resource list, read into the
client's V1APIVersions, V1APIGroupList and V1APIResourceList models) says which kinds are
served. For each listable kind, through its typed API (CoreV1Api, AppsV1Api, ...) or, for
kinds the client has no class for, CustomObjectsApi:

- list every object (list_*_for_all_namespaces or list_*): the list and each item become
  models; a kind with no object fails (every served kind needs a fixture);
- the first watch event (watch.Watch().stream) becomes a model;
- objects of NAMESPACE (or, cluster-scoped, those named every-*/everything, else all) are
  read (read_*) and their models serialized (ApiClient().sanitize_for_serialization) must
  equal the JSON the server sent: a field the model drops or changes is a mismatch;
- where the kind can be updated, the model is written back (replace_*) and read again, and
  both answers must equal what was sent (but resourceVersion and managedFields, and the
  status of kinds whose status is a subresource);
- the status subresource, where there is one, is read into the model too.

Pods are also watched in NAMESPACE: the initial ADDED events and the MODIFIED event of a
label patch arrive as V1Pod models.

Prints one `ok` or `FAIL` line per kind, then `KINDS <json>`: every group/version/Kind
checked. Exits 1 when anything failed. client_side_validation stays at the client's
default (on), so a null required field raises ValueError, reported with the kind.
"""

import datetime
import json
import re
import sys
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
# Fields a write may change by itself (metadata) or that another writer owns.
VOLATILE = ("resourceVersion", "managedFields")


def get(api, path, model=None):
    """GET `path` through the client's own request path: the server's JSON, or `model`."""
    request = api.param_serialize(
        "GET",
        path,
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    response.read()
    if model is not None or not 200 <= response.status <= 299:
        return api.response_deserialize(response, {"200": model}).data
    return json.loads(response.data)


def snake(kind):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", kind).lower()


def api_class_name(group, version):
    """The client's class of a group version: apps/v1 -> AppsV1Api,
    rbac.authorization.k8s.io/v1 -> RbacAuthorizationV1Api, v1 -> CoreV1Api."""
    if not group:
        parts = ["core"]
    else:
        parts = group.removesuffix(".k8s.io").split(".")
    return "".join(p.capitalize() for p in parts) + version.capitalize() + "Api"


def normalize(value):
    """JSON as a model's serialization would compare with it: nulls dropped, times as
    instants (the client writes +00:00 where the server wrote Z)."""
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, str) and TIME.match(value):
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed.astimezone(datetime.timezone.utc).isoformat()
    return value


def differences(want, got, path=""):
    """Paths where two JSON values differ, with both sides."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            p = f"{path}.{k}" if path else k
            if k not in got:
                out.append(f"{p}: {json.dumps(want[k])[:120]} is lost")
            elif k not in want:
                out.append(f"{p}: {json.dumps(got[k])[:120]} appears")
            else:
                out.extend(differences(want[k], got[k], p))
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        out = []
        for i, (a, b) in enumerate(zip(want, got)):
            out.extend(differences(a, b, f"{path}[{i}]"))
        return out
    if want != got:
        return [f"{path}: {json.dumps(want)[:120]} became {json.dumps(got)[:120]}"]
    return []


def without(obj, status_too):
    """A serialized object without what a write may change by itself."""
    obj = json.loads(json.dumps(obj))
    meta = obj.get("metadata", {})
    for k in VOLATILE:
        meta.pop(k, None)
    if status_too:
        obj.pop("status", None)
    return obj


class Kind:
    """One served kind and the client calls that reach it."""

    def __init__(self, api, group, version, resource, status_subresource):
        self.api = api
        self.group = group
        self.version = version
        self.resource = resource
        self.status_subresource = status_subresource
        self.gvk = f"{group}/{version}/{resource.kind}" if group else f"{version}/{resource.kind}"
        self.namespaced = resource.namespaced
        cls = getattr(client, api_class_name(group, version), None)
        name = snake(resource.kind)
        scope = "namespaced_" if self.namespaced else ""
        self.typed = None
        if cls is not None and hasattr(cls, f"read_{scope}{name}"):
            self.typed = cls(api)
            self.read_name = f"read_{scope}{name}"
            self.replace_name = f"replace_{scope}{name}"
            self.status_name = f"read_{scope}{name}_status"
            if self.namespaced and hasattr(cls, f"list_{name}_for_all_namespaces"):
                self.list_name = f"list_{name}_for_all_namespaces"
            else:
                self.list_name = f"list_{scope}{name}"
        self.custom = client.CustomObjectsApi(api)

    def list_fn(self):
        """The list function and its arguments (watch.stream takes the same)."""
        if self.typed is not None:
            return getattr(self.typed, self.list_name), ()
        return self.custom.list_cluster_custom_object, (
            self.group,
            self.version,
            self.resource.name,
        )

    def items(self):
        fn, args = self.list_fn()
        listed = fn(*args)
        if self.typed is not None:
            return listed.items or []
        return listed.get("items") or []

    @staticmethod
    def meta(obj):
        if isinstance(obj, dict):
            m = obj.get("metadata") or {}
            return m.get("name"), m.get("namespace")
        return obj.metadata.name, obj.metadata.namespace

    def path(self, name, ns):
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        scope = f"/namespaces/{ns}" if self.namespaced else ""
        return f"{base}{scope}/{self.resource.name}/{name}"

    def raw(self, name, ns):
        return get(self.api, self.path(name, ns))

    def read(self, name, ns):
        if self.typed is not None:
            fn = getattr(self.typed, self.read_name)
            return fn(name, ns) if self.namespaced else fn(name)
        if self.namespaced:
            return self.custom.get_namespaced_custom_object(
                self.group, self.version, ns, self.resource.name, name
            )
        return self.custom.get_cluster_custom_object(
            self.group, self.version, self.resource.name, name
        )

    def read_status(self, name, ns):
        if self.typed is not None:
            fn = getattr(self.typed, self.status_name)
            return fn(name, ns) if self.namespaced else fn(name)
        if self.namespaced:
            return self.custom.get_namespaced_custom_object_status(
                self.group, self.version, ns, self.resource.name, name
            )
        return self.custom.get_cluster_custom_object_status(
            self.group, self.version, self.resource.name, name
        )

    def replace(self, name, ns, body):
        if self.typed is not None:
            fn = getattr(self.typed, self.replace_name)
            return fn(name, ns, body) if self.namespaced else fn(name, body)
        if self.namespaced:
            return self.custom.replace_namespaced_custom_object(
                self.group, self.version, ns, self.resource.name, name, body
            )
        return self.custom.replace_cluster_custom_object(
            self.group, self.version, self.resource.name, name, body
        )

    def serialize(self, obj):
        return self.api.sanitize_for_serialization(obj)


def round_trip(kind, name, ns):
    """Read, compare with the server's JSON, write back, read again; the problems found."""
    problems = []
    # The model of a read and the server's JSON of another: compared once both saw the same
    # version of the object (a busy one may change in between).
    for _ in range(5):
        model_json = normalize(kind.serialize(kind.read(name, ns)))
        raw = normalize(kind.raw(name, ns))
        version = (raw.get("metadata") or {}).get("resourceVersion")
        if version == model_json.get("metadata", {}).get("resourceVersion"):
            for d in differences(raw, model_json):
                problems.append(f"{name}: server JSON vs model: {d}")
            break
        time.sleep(0.2)
    else:
        problems.append(f"{name}: changed between every two reads")
    if kind.status_subresource:
        kind.read_status(name, ns)
    if "update" not in kind.resource.verbs:
        return problems
    status_too = kind.status_subresource
    last = []
    for _ in range(5):
        obj = kind.read(name, ns)
        sent = without(normalize(kind.serialize(obj)), status_too)
        try:
            replaced = kind.replace(name, ns, obj)
        except ApiException as e:
            if e.status == 409:
                time.sleep(0.2)
                continue
            raise
        back = without(normalize(kind.serialize(replaced)), status_too)
        again = without(normalize(kind.serialize(kind.read(name, ns))), status_too)
        last = [f"{name}: written vs answered: {d}" for d in differences(sent, back)]
        last += [f"{name}: answered vs read again: {d}" for d in differences(back, again)]
        if not last:
            return problems
        time.sleep(0.2)
    return problems + (last or [f"{name}: replace conflicted five times"])


def chosen(kind, items, ns):
    """The objects to round-trip: the namespace's, or named every-*; else the first three."""
    mine = []
    for obj in items:
        name, namespace = kind.meta(obj)
        if (kind.namespaced and namespace == ns) or (
            not kind.namespaced and name.startswith("every")
        ):
            mine.append((name, namespace))
    if not mine:
        mine = [kind.meta(obj) for obj in items[:3]]
    return mine


def first_watch_event(kind):
    fn, args = kind.list_fn()
    w = watch.Watch()
    try:
        for event in w.stream(fn, *args, timeout_seconds=5, _request_timeout=15):
            obj = event["object"]
            if kind.typed is not None and isinstance(obj, dict):
                raise ValueError(f"watch event not read into a model: {event['raw_object']}")
            return event["type"]
    finally:
        w.stop()
    raise ValueError("the watch sent no event for existing objects")


def check(kind, ns):
    items = kind.items()
    if not items:
        raise ValueError("no object to read back: give this kind a fixture")
    problems = []
    done = 0
    for name, namespace in chosen(kind, items, ns):
        problems.extend(round_trip(kind, name, namespace))
        done += 1
    if "watch" in kind.resource.verbs:
        first = first_watch_event(kind)
        if first != "ADDED":
            problems.append(f"first watch event is {first}, not ADDED")
    if problems:
        raise ValueError("; ".join(problems))
    return len(items), done


def watch_pods(api, ns):
    """ADDED for the namespace's pods, then MODIFIED for a label patched meanwhile."""
    core = client.CoreV1Api(api)
    names = {p.metadata.name for p in core.list_namespaced_pod(ns).items}
    if not names:
        raise ValueError(f"no pod in {ns} to watch")
    target = sorted(names)[0]
    stamp = str(int(time.time() * 1000))
    added = set()
    patched = False
    w = watch.Watch()
    deadline = time.time() + 30
    for event in w.stream(core.list_namespaced_pod, ns, timeout_seconds=30):
        pod = event["object"]
        if not isinstance(pod, client.V1Pod):
            raise ValueError(f"watch event not a V1Pod: {type(pod).__name__}")
        if event["type"] == "ADDED":
            added.add(pod.metadata.name)
        if added >= names and not patched:
            core.patch_namespaced_pod(target, ns, {"metadata": {"labels": {"watched": stamp}}})
            patched = True
        if (
            patched
            and event["type"] == "MODIFIED"
            and pod.metadata.name == target
            and (pod.metadata.labels or {}).get("watched") == stamp
        ):
            w.stop()
            return
        if time.time() > deadline:
            break
    w.stop()
    raise ValueError(
        f"watch ended: ADDED for {sorted(added)} of {sorted(names)}, patched={patched}, "
        "no MODIFIED event with the label"
    )


def discover(api):
    """(group, version, V1APIResource, has status subresource) of every served resource."""
    versions = [("", v) for v in client.CoreApi(api).get_api_versions().versions]
    for group in client.ApisApi(api).get_api_versions().groups:
        versions.extend((group.name, v.version) for v in group.versions)
    out = []
    for group, version in versions:
        path = f"/api/{version}" if not group else f"/apis/{group}/{version}"
        listed = get(api, path, "V1APIResourceList")
        names = {r.name for r in listed.resources}
        for r in listed.resources:
            if "/" not in r.name:
                out.append((group, version, r, f"{r.name}/status" in names))
    return out


def main():
    ns = sys.argv[1]
    config.load_kube_config()
    api = client.ApiClient()
    assert api.configuration.client_side_validation, "client-side validation is on"
    failures = []
    checked = []
    for group, version, resource, status in discover(api):
        if "list" not in resource.verbs:
            print(f"skip {group}/{version} {resource.name}: verbs {resource.verbs}")
            continue
        kind = Kind(api, group, version, resource, status)
        how = "typed" if kind.typed is not None else "CustomObjectsApi"
        try:
            listed, round_tripped = check(kind, ns)
            print(f"ok   {kind.gvk} ({how}): {listed} listed, {round_tripped} read back")
            checked.append(kind.gvk)
        except Exception as e:  # every failure is reported with its kind
            failures.append(kind.gvk)
            print(f"FAIL {kind.gvk} ({how}): {type(e).__name__}: {e}")
    try:
        watch_pods(api, ns)
        print(f"ok   watch pods in {ns}")
    except Exception as e:
        failures.append("watch pods")
        print(f"FAIL watch pods in {ns}: {type(e).__name__}: {e}")
    print("KINDS " + json.dumps(sorted(checked + failures)))
    if failures:
        print(f"{len(failures)} failed: {', '.join(failures)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
