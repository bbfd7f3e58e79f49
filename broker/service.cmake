# Running the broker as a service (docs/service.md): --config files and
# sd_notify. libsystemd (Debian: libsystemd-dev) is optional: without it the
# broker does not send READY=1 or watchdog pings, so the Type=notify unit
# would not start it; use Type=simple there.
target_sources(kvb_broker_core PRIVATE ${CMAKE_CURRENT_LIST_DIR}/config.c
  ${CMAKE_CURRENT_LIST_DIR}/sdnotify.c)
option(KVB_SYSTEMD "sd_notify through libsystemd when it is found" ON)
if(KVB_SYSTEMD)
  pkg_check_modules(LIBSYSTEMD IMPORTED_TARGET libsystemd)
endif()
if(LIBSYSTEMD_FOUND)
  target_compile_definitions(kvb_broker_core PUBLIC KVB_HAVE_SYSTEMD=1)
  target_link_libraries(kvb_broker_core PUBLIC PkgConfig::LIBSYSTEMD)
  set(KVB_HAVE_SYSTEMD ON)
else()
  message(STATUS "libsystemd not found (Debian: libsystemd-dev) or "
    "KVB_SYSTEMD=OFF: kvbroker is built without sd_notify; the Type=notify "
    "systemd unit needs it (docs/service.md)")
  set(KVB_HAVE_SYSTEMD OFF)
endif()
set(KVB_HAVE_SYSTEMD ${KVB_HAVE_SYSTEMD} PARENT_SCOPE)
