"""`sam` with every Lambda container on the host's network, for a dockerd
without a bridge network (scripts/sam-local.sh starts one so; containers
there reach only 127.0.0.1, as this machine's rules require).

Run with the Python of target/sam-venv, with sam's own arguments:

    target/sam-venv/bin/python scripts/sam-host-network.py local invoke ...

Why: `sam local invoke --docker-network host` still creates the container
on the default network with its Runtime Interface Emulator (RIE) port
published, which a bridge-less dockerd cannot do; SAM then waits 20 s for
a container that never answers and exits 0. So container creation is
wrapped here: no published ports, network_mode "host", and the RIE told to
listen on 127.0.0.1 at the port SAM picked for it (SAM connects there), its
Runtime API on another free loopback port (two containers in a row must
not meet on RIE's fixed defaults, 8080 and 9001, on the shared network).

Also: no call to AWS STS for the account id (see below).

Relies on SAM internals (samcli.local.docker: the RIE entry point, the
"8080" port key of the container it creates; InvokeContext's account id
lookup), so it refuses any SAM
version but the one scripts/sam-cli.sh pins. With an ordinary Docker none
of this is needed: `sam local invoke --docker-network host` works.
"""

import socket
import sys
from importlib.metadata import version

import docker.models.containers

PINNED = "1.170.0"  # scripts/sam-cli.sh's SAM_CLI_VERSION
RIE = "/var/rapid/aws-lambda-rie"

if version("aws-sam-cli") != PINNED:
    sys.exit(f"sam-host-network.py: written for aws-sam-cli {PINNED}, found {version('aws-sam-cli')}")

_create = docker.models.containers.ContainerCollection.create


def _free_loopback_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_on_host_network(self, image, command=None, **kwargs):
    entrypoint = list(kwargs.get("entrypoint") or [])
    ports = kwargs.pop("ports", None) or {}
    if not entrypoint or entrypoint[0] != RIE or set(ports) != {"8080"}:
        # A debugger's ports, a build container: not what this wraps.
        sys.exit(f"sam-host-network.py: unexpected container (entrypoint {entrypoint}, ports {ports})")
    _, rie_port = ports["8080"]
    kwargs["entrypoint"] = entrypoint + [
        "--runtime-interface-emulator-address",
        f"127.0.0.1:{rie_port}",
        "--runtime-api-address",
        f"127.0.0.1:{_free_loopback_port()}",
    ]
    kwargs["network_mode"] = "host"
    return _create(self, image, command, **kwargs)


docker.models.containers.ContainerCollection.create = create_on_host_network

# Before each invoke SAM asks AWS STS who the caller is (for
# AWS::AccountId), over the network; the default account id does here.
from samcli.commands.local.cli_common.invoke_context import InvokeContext  # noqa: E402
from samcli.cli.main import cli  # noqa: E402

InvokeContext._add_account_id_to_global = lambda self: None

sys.argv[0] = "sam"
sys.exit(cli())
