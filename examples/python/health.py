#!/usr/bin/env python3
"""Health check with the standard grpc.health.v1 client (grpcio-health-checking).

Exits 0 when the daemon answers SERVING, 1 otherwise. No token needed: the health
service is reachable without one.

    python health.py --addr 127.0.0.1:7433 [--service ostler.v1.SessionService]
"""
import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", default=os.environ.get("OSTLER_ADDR", "127.0.0.1:7433"))
    p.add_argument("--service", default="")
    args = p.parse_args()
    with grpc.insecure_channel(args.addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=10)
        except grpc.RpcError as e:
            print(f"health check failed: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    print(f"{args.addr} {args.service or '(daemon)'}: {status}")
    return 0 if resp.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
