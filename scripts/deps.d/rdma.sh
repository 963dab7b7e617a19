# NVMe over RDMA (daemon/rdma, test/rdma, docs/RDMA.md): rdma-core's verbs
# and connection manager. The -dev packages carry the headers and .so links
# that `go build -tags rdma` needs; ibverbs-providers holds the soft-RoCE
# (rxe) provider that test/vm copies into the Linux test guest, with
# rdmacm-utils' rping and ibverbs-utils' ibv_devinfo for diagnosis there.
# A default build (no rdma tag) needs none of them.
APT_PACKAGES="libibverbs-dev librdmacm-dev ibverbs-providers rdmacm-utils ibverbs-utils"
