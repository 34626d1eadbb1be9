"""One door to AWS: a session from the normal credential chain, clients whose every call is
bounded in time (``retry``: timeouts, a retry budget, progress while retrying), the test seam,
and AWS errors turned into one line with a hint.

boto3 is imported here, lazily, inside functions: importing this module stays cheap.

Every EC2/SSM call of the provider goes through :meth:`Aws.call`.  ``HOOKS`` is the one seam
where tests (and nothing else) wrap calls: ``hook(service, op, kwargs, call) -> response``
may raise, return its own response, or call ``call()`` and look at or change the real one.
It is how the tests stand in for APIs the moto server lacks (placement groups) and inject
faults the server cannot produce (capacity errors, Ctrl-C, DependencyViolation).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

from clustertool.core.errors import ProviderError, ToolError, UsageError
from clustertool.core.model import Reporter, silent
from clustertool.providers.aws import retry

Hook = Callable[[str, str, dict, Callable[[], Any]], Any]
HOOKS: list[Hook] = []
_LOADER: list[Any] = []

CREDENTIAL_CODES = {"AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch", "UnrecognizedClientException",
                    "ExpiredToken", "RequestExpired", "InvalidAccessKeyId", "ExpiredTokenException"}
DENIED_CODES = {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "OptInRequired", "Blocked"}
QUOTA_CODES = {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded",
               "PlacementGroupLimitExceeded", "SecurityGroupLimitExceeded", "KeyPairLimitExceeded",
               "ResourceLimitExceeded", "RulesPerSecurityGroupLimitExceeded"}
CAPACITY_CODES = {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
                  "InsufficientReservedInstanceCapacity", "InsufficientFreeAddressesInSubnet",
                  "SpotMaxPriceTooLow", "Unsupported", "InsufficientCapacityOnHost"}
THROTTLE_CODES = retry.THROTTLE_CODES
# a launch that fails with one of these is worth retrying in the next Availability Zone
NEXT_AZ_CODES = CAPACITY_CODES | {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"}


def poll_interval() -> float:
    """Seconds between polls while waiting (CLUSTERTOOL_AWS_POLL; tests use a few ms)."""
    return float(os.environ.get("CLUSTERTOOL_AWS_POLL") or 5.0)


def wait_timeout() -> float:
    """Longest wait for instances to run / pass checks / terminate (CLUSTERTOOL_AWS_TIMEOUT)."""
    return float(os.environ.get("CLUSTERTOOL_AWS_TIMEOUT") or 1200.0)


class Aws:
    """A boto3 session for one region (and optional profile) with retrying, time-bounded clients.

    ``report`` gets the progress lines of retries; ``tick``, when set, runs before each call
    (``up`` refreshes its lease there)."""

    _owner: object  # owner.caller's cache of an owner.Owner (absent until its first STS call; not imported: a cycle)

    def __init__(self, region: str | None = None, profile: str | None = None, report: Reporter = silent):
        import boto3
        import botocore.session
        from botocore.exceptions import ProfileNotFound

        core = botocore.session.Session()
        if _LOADER:  # service models are parsed once per process, not once per session
            core.register_component("data_loader", _LOADER[0])
        else:
            _LOADER.append(core.get_component("data_loader"))
        try:
            self.session = boto3.session.Session(botocore_session=core, profile_name=profile, region_name=region)
            self.region = self.session.region_name
        except ProfileNotFound:
            raise UsageError(f"AWS profile {profile!r} not found",
                             hint="list profiles with `aws configure list-profiles`") from None
        self.profile = profile
        if not self.region:
            raise UsageError("no AWS region given",
                             hint="pass --region, set AWS_DEFAULT_REGION, or give the profile a region")
        self._clients: dict[str, Any] = {}
        self.report = report
        self.tick: Callable[[], None] | None = None
        self._ticking = False

    def client(self, service: str) -> Any:  # a boto3 client (boto3-stubs left out: Any)
        if service not in self._clients:
            from botocore.config import Config

            connect, read = retry.attempt_timeouts()
            config = Config(
                retries={"total_max_attempts": 1, "mode": "standard"},  # retry.run retries, in view
                connect_timeout=connect, read_timeout=read, user_agent_extra="clustertool",
            )
            endpoint = (os.environ.get(f"AWS_ENDPOINT_URL_{service.upper()}")
                        or os.environ.get("AWS_ENDPOINT_URL") or None)
            self._clients[service] = self.session.client(service, config=config, endpoint_url=endpoint)
        return self._clients[service]

    def call(self, op: str, service: str = "ec2", **kwargs: Any) -> Any:
        """Call one API operation; AWS ClientErrors pass through, environment errors become ToolErrors."""
        from botocore import exceptions as bx
        from botocore.parsers import ResponseParserError

        def real() -> Any:
            client = self.client(service)
            name = client.meta.method_to_api_mapping.get(op, op)
            return retry.run(lambda: getattr(client, op)(**kwargs), op=name, endpoint=client.meta.endpoint_url,
                             report=self.report)

        self._beat()
        call = real
        for hook in reversed(HOOKS):
            call = _bind(hook, service, op, kwargs, call)
        try:
            return call()
        except (bx.NoCredentialsError, bx.PartialCredentialsError):
            raise ToolError("no AWS credentials found",
                            hint="configure them (`aws configure`, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                                 "or --profile NAME)") from None
        except (bx.ConnectionError, bx.HTTPClientError) as exc:  # retry.run normally words these
            raise ProviderError(f"cannot reach AWS ({service} in {self.region}): {_one_line(str(exc))}",
                                hint="check the network, --region, and AWS_ENDPOINT_URL if set") from None
        except bx.ClientError as exc:
            if error_code(exc) in ("NotImplemented", "InvalidAction", "UnsupportedOperation"):
                raise EndpointLacksApi(f"the endpoint does not implement {op}") from None
            if error_code(exc).isdigit() and int(error_code(exc)) >= 500:  # HTTP 5xx without an AWS error body
                raise EndpointLacksApi(f"the endpoint gave no valid answer to {op} (not implemented there?)") from None
            raise
        except ResponseParserError:  # an endpoint answering HTML / garbage, e.g. an emulator lacking the API
            raise EndpointLacksApi(f"the endpoint gave no valid answer to {op} (not implemented there?)") from None
        except bx.BotoCoreError as exc:
            raise ProviderError(f"AWS {op} failed: {_one_line(str(exc))}") from None

    def _beat(self) -> None:
        if self.tick is None or self._ticking:
            return
        self._ticking = True
        try:
            self.tick()
        finally:
            self._ticking = False

    def paginate(self, op: str, key: str, service: str = "ec2", **kwargs: Any) -> list[dict]:
        """All items of a paginated describe call (follows NextToken through :meth:`call`)."""
        items: list[dict] = []
        while True:
            page = self.call(op, service, **kwargs)
            items += page.get(key, [])
            token = page.get("NextToken")
            if not token:
                return items
            kwargs["NextToken"] = token


class EndpointLacksApi(ProviderError):
    """The endpoint (an EC2-compatible emulator, say) does not implement an operation."""


def _bind(hook: Hook, service: str, op: str, kwargs: dict, inner: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: hook(service, op, kwargs, inner)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return _one_line(response.get("Error", {}).get("Message", "") or str(exc))
    return _one_line(str(exc))


def is_code(exc: BaseException, *codes: str) -> bool:
    code = error_code(exc)
    return any(code == c or code.startswith(c + ".") for c in codes)


def hint_for(code: str, message: str = "") -> str | None:
    if code in CREDENTIAL_CODES:
        return "AWS rejected the credentials: check `aws sts get-caller-identity`, --profile, AWS_PROFILE"
    if code in DENIED_CODES or code.startswith("AccessDenied"):
        return "the IAM identity lacks a permission this needs (ec2:RunInstances, ec2:Describe*, ssm:GetParameter ...)"
    if code in QUOTA_CODES or (code.endswith("LimitExceeded") and code not in THROTTLE_CODES):
        return "raise the quota in the Service Quotas console (e.g. 'Running On-Demand P instances', in vCPUs)"
    if code in CAPACITY_CODES:
        return ("AWS has no capacity for this now: try another --az or --region, fewer nodes, later, "
                "or a capacity reservation")
    if code == "InvalidInstanceType" or (code == "InvalidParameterValue" and "instance type" in message.lower()):
        return "check the instance type name (e.g. p4d.24xlarge) and that the region offers it"
    if code in THROTTLE_CODES:
        return "AWS kept throttling after retries; wait a minute and run it again"
    return None


def to_tool_error(exc: BaseException, what: str) -> ToolError:
    code, message = error_code(exc), error_message(exc)
    if code in ("InvalidInstanceType",):
        return UsageError(f"{what}: {message}", hint=hint_for(code, message))
    return ProviderError(f"{what}: {code or 'error'}: {message}", hint=hint_for(code, message))


@contextlib.contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """Turn AWS ClientErrors escaping the block into one-line ToolErrors."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as exc:
        raise to_tool_error(exc, what) from None
