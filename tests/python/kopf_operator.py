"""An operator written with kopf, as its documentation teaches, for `Greeting` objects
(greetings.kopf.skiff.io/v1, with a status subresource).

Run: kopf run --standalone --namespace NS kopf_operator.py  (the cluster is $KUBECONFIG's)

- create: makes a ConfigMap `<name>-greeting` holding spec.message, adopted by the Greeting
  (kopf.adopt: owner reference, namespace), and reports it in the status;
- update of spec.message: rewrites the ConfigMap and the status;
- delete (kopf holds the object with its finalizer meanwhile): writes a ConfigMap
  `<name>-farewell` (not owned) recording the uid and deletionTimestamp it saw;
- a timer every second counts in status.ticks.

Status changes go through the handlers' `patch`, which kopf writes to the status
subresource. The ConfigMaps are written with the official kubernetes client.
"""

import kopf
from kubernetes import client, config

GROUP, VERSION, PLURAL = "kopf.skiff.io", "v1", "greetings"


@kopf.on.startup()
def configure(settings, **_):
    config.load_kube_config()
    settings.watching.server_timeout = 30
    settings.watching.client_timeout = 40


def core():
    return client.CoreV1Api()


def child(name, message):
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-greeting"},
        "data": {"message": message},
    }


@kopf.on.create(GROUP, VERSION, PLURAL)
def create(body, spec, name, namespace, patch, **_):
    cm = child(name, spec.get("message", ""))
    kopf.adopt(cm)
    core().create_namespaced_config_map(namespace, client.V1ConfigMap.from_dict(cm))
    kopf.info(body, reason="ChildCreated", message=f"made ConfigMap {cm['metadata']['name']}")
    patch.status["child"] = cm["metadata"]["name"]
    patch.status["message"] = spec.get("message", "")


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec.message")
def update(new, name, namespace, patch, **_):
    core().patch_namespaced_config_map(
        f"{name}-greeting", namespace, {"data": {"message": new or ""}}
    )
    patch.status["message"] = new or ""


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete(name, namespace, uid, meta, **_):
    farewell = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-farewell"},
        "data": {
            "uid": uid,
            "deletionTimestamp": str(meta.get("deletionTimestamp") or ""),
        },
    }
    core().create_namespaced_config_map(namespace, client.V1ConfigMap.from_dict(farewell))


@kopf.timer(GROUP, VERSION, PLURAL, interval=1.0)
def tick(status, patch, **_):
    patch.status["ticks"] = int(status.get("ticks") or 0) + 1
