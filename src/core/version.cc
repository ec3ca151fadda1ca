#include "seqpar/version.h"

namespace seqpar {

std::string_view version() { return SEQPAR_VERSION_STRING; }

}  // namespace seqpar
