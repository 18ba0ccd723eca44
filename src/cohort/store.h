// The key-value store the ranks meet at: a TCPStore-compatible server and client, with authentication.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/store.h"
//   auto server = std::make_shared<cohort::store::StoreServer>("127.0.0.1", 29500, secret);
#pragma once

#include "cohort/store/AuthStore.h"
#include "cohort/store/Socket.h"
#include "cohort/store/StoreProtocol.h"
#include "cohort/store/StoreServer.h"
#include "cohort/store/TcpStoreClient.h"
