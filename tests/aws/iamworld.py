"""What of a recovery controller's identity is left in moto: roles and instance profiles under clustertool's
path tagged with a cluster, and instance profile associations of those profiles (boto3 straight to moto, only
to assert; the tool's own calls go through providers/aws/controller_iam.py)."""

from __future__ import annotations

PATH = "/clustertool/"


def clients(url: str):
    import boto3

    return (boto3.client("iam", endpoint_url=url, region_name="us-east-1"),
            boto3.client("ec2", endpoint_url=url, region_name="us-east-1"))


def _tagged(tag_list: list[dict], cluster: str) -> bool:
    return any(t["Key"] == "clustertool:cluster" and t["Value"] == cluster for t in tag_list or [])


def roles(url: str, cluster: str) -> list[str]:
    iam, _ = clients(url)
    return [r["RoleName"] for r in iam.list_roles(PathPrefix=PATH)["Roles"]
            if _tagged(iam.list_role_tags(RoleName=r["RoleName"])["Tags"], cluster)]


def profiles(url: str, cluster: str) -> list[str]:
    iam, _ = clients(url)
    return [p["InstanceProfileName"] for p in iam.list_instance_profiles(PathPrefix=PATH)["InstanceProfiles"]
            if _tagged(iam.get_instance_profile(InstanceProfileName=p["InstanceProfileName"])["InstanceProfile"]
                       .get("Tags", []), cluster)]


def associations(url: str, cluster: str) -> list[dict]:
    """Live associations of a profile of ``cluster`` (its name is in the profile's: clustertool-ctl-<id>)."""
    _, ec2 = clients(url)
    found = ec2.describe_iam_instance_profile_associations()["IamInstanceProfileAssociations"]
    return [a for a in found if f"{PATH}clustertool-ctl-{cluster}-" in a["IamInstanceProfile"]["Arn"]
            and a["State"] in ("associating", "associated")]


def leaks(url: str, cluster: str) -> int:
    return len(roles(url, cluster)) + len(profiles(url, cluster)) + len(associations(url, cluster))


def every_controller_resource(url: str) -> int:
    """Every role and profile under clustertool's path, whatever cluster (the tests make no others)."""
    iam, _ = clients(url)
    return len(iam.list_roles(PathPrefix=PATH)["Roles"]) + \
        len(iam.list_instance_profiles(PathPrefix=PATH)["InstanceProfiles"])
