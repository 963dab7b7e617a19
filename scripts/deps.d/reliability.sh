# reliability: the network-partition campaign (root only) creates network
# namespaces, veth pairs and a bridge with iproute2's ip command.
APT_PACKAGES="iproute2"
