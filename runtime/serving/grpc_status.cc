#include "runtime/serving/grpc_status.h"
