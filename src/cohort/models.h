// The models (ResNets, the fast CIFAR ResNet, ViT) with torchvision/timm names, their FLOPs and the loss.
// One header for the whole area, for programs that use cohort as a library; cohort's own code includes
// the headers it uses one by one.
//
//   #include "cohort/models.h"
//   auto net = cohort::models::build({.name = "resnet20", .width = 16, .num_classes = 10}, /*in_channels=*/1);
#pragma once

#include "cohort/models/Airbench.h"
#include "cohort/models/Flops.h"
#include "cohort/models/Loss.h"
#include "cohort/models/Models.h"
#include "cohort/models/TestTimeAugmentation.h"
#include "cohort/models/Vit.h"
