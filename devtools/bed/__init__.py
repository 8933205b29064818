"""A multi-host test bed on one machine: network namespaces joined by a bridge, each namespace a host.

Hosts (``topology.HOSTS``): a data host (its own PostgreSQL cluster, Redis and RabbitMQ node), two web
hosts (daphne), two worker hosts (a GPU worker each, on CPU here), a load balancer host (HAProxy with the
shipped ``deploy/haproxy/haproxy.cfg``) and a client host from which drills and browsers connect. All
addresses are in ``10.231.0.0/24`` and exist only inside the bed's namespaces; the bridge itself lives in a
namespace of its own, so the machine's own network is never touched.

``scripts/bed up`` / ``scripts/bed down`` (``python -m devtools.bed``). Knows nothing of Django: the bed's
processes are the product's own commands started inside the namespaces.
"""
