"""The EC2 stand-in's documents (tests/aws/ec2shapes.py) are read and written by botocore's own EC2
model: what botocore sends decodes back to the same parameters, what the stand-in answers parses
in botocore to the same data, and documents that do not fit the model are refused."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.aws import ec2shapes

pytest.importorskip("botocore")
UTC = dt.timezone.utc


def _sent(op: str, params: dict) -> dict:
    """The form fields botocore's EC2 serializer puts on the wire (as strings, like HTTP carries them)."""
    import botocore.serialize

    body = botocore.serialize.create_serializer("ec2").serialize_to_request(params, ec2shapes.operation(op))["body"]
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in body.items()}


def test_run_instances_request_with_reservation_and_market_options_decodes_to_what_botocore_was_given():
    params = {"ImageId": "ami-1", "InstanceType": "p5.48xlarge", "MinCount": 4, "MaxCount": 4,
              "Placement": {"AvailabilityZone": "us-east-1b", "GroupName": "pg"},
              "CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": "cr-1"}},
              "InstanceMarketOptions": {"MarketType": "capacity-block"},
              "NetworkInterfaces": [{"DeviceIndex": 0, "Groups": ["sg-1"], "AssociatePublicIpAddress": False}],
              "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "a", "Value": "b"}]}]}
    assert ec2shapes.decode_request("RunInstances", _sent("RunInstances", params)) == params


def test_request_with_an_unknown_or_missing_required_parameter_or_bad_enum_is_refused_like_ec2():
    fields = _sent("DescribeCapacityReservations", {"CapacityReservationIds": ["cr-1"]})
    with pytest.raises(ec2shapes.RequestError) as unknown:
        ec2shapes.decode_request("DescribeCapacityReservations", {**fields, "CapacityReservationID.1": "cr-2"})
    assert unknown.value.code == "UnknownParameter" and "CapacityReservationID.1" in unknown.value.message
    with pytest.raises(ec2shapes.RequestError) as missing:
        ec2shapes.decode_request("DescribeCapacityBlockOfferings", {"Action": "DescribeCapacityBlockOfferings",
                                                                     "InstanceType": "p5.48xlarge"})
    assert missing.value.code == "MissingParameter" and "CapacityDurationHours" in missing.value.message
    with pytest.raises(ec2shapes.RequestError) as bad:
        ec2shapes.decode_request("RunInstances", {**_sent("RunInstances", {"MinCount": 1, "MaxCount": 1}),
                                                  "CapacityReservationSpecification.CapacityReservationPreference":
                                                      "reserved-only"})
    assert bad.value.code == "InvalidParameterValue"


def test_answers_parse_in_botocore_to_the_same_reservations_offerings_and_topology():
    end = dt.datetime(2027, 1, 2, 3, 4, 5, tzinfo=UTC)
    cases = {
        "DescribeCapacityReservations": {"CapacityReservations": [
            {"CapacityReservationId": "cr-1", "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1b",
             "AvailableInstanceCount": 3, "TotalInstanceCount": 4, "State": "active", "EndDate": end,
             "ReservationType": "capacity-block", "EbsOptimized": True, "Tags": [{"Key": "k", "Value": "v"}]}]},
        "DescribeCapacityBlockOfferings": {"CapacityBlockOfferings": [
            {"CapacityBlockOfferingId": "cb-1", "InstanceCount": 4, "StartDate": end, "EndDate": end,
             "CapacityBlockDurationHours": 48, "UpfrontFee": "7840.32", "CurrencyCode": "USD"}]},
        "DescribeInstanceTopology": {"Instances": [
            {"InstanceId": "i-1", "NetworkNodes": ["nn-1", "nn-2", "nn-3"], "AvailabilityZone": "us-east-1b"}]},
    }
    for op, result in cases.items():
        parsed = ec2shapes.parse_response(op, ec2shapes.encode_response(op, result))
        parsed.pop("ResponseMetadata")
        assert parsed == result, op


def test_answer_that_does_not_fit_the_output_shape_is_refused_and_a_misnamed_document_parses_empty():
    with pytest.raises(ec2shapes.ShapeError, match="no member 'AvailableCount'"):
        ec2shapes.encode_response("DescribeCapacityReservations",
                                  {"CapacityReservations": [{"AvailableCount": 3}]})
    with pytest.raises(ec2shapes.ShapeError, match="integer"):
        ec2shapes.encode_response("DescribeCapacityReservations",
                                  {"CapacityReservations": [{"AvailableInstanceCount": "3"}]})
    with pytest.raises(ec2shapes.ShapeError, match="not one of"):
        ec2shapes.encode_response("DescribeCapacityReservations", {"CapacityReservations": [{"State": "running"}]})
    with pytest.raises(ec2shapes.ShapeError, match="aware datetime"):
        ec2shapes.encode_response("DescribeCapacityReservations",
                                  {"CapacityReservations": [{"EndDate": dt.datetime(2027, 1, 1)}]})
    # the check is botocore's: elements named as in the request (not the output's locationName) are not read
    wrong = (b'<DescribeInstanceTopologyResponse><Instances><item><InstanceId>i-1</InstanceId></item></Instances>'
             b"</DescribeInstanceTopologyResponse>")
    assert "Instances" not in ec2shapes.parse_response("DescribeInstanceTopology", wrong)
